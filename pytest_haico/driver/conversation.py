"""One scripted conversation over the backend's SSE API, its per-turn metrics and its verdict."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg

from pytest_haico.config.experiment import Arm, Script, Turn
from pytest_haico.driver import wire
from pytest_haico.driver.judge import (
    Finding,
    TurnState,
    judge_snapshot,
    judge_stream_end,
    judge_turn,
    make_finding,
)
from pytest_haico.driver.judging import Scorer, score_judge
from pytest_haico.driver.result import ConversationResult
from pytest_haico.driver.snapshots import Snapshot, SnapshotReader, read_snapshot
from pytest_haico.driver.sse import SSEDecoder
from pytest_haico.driver.transcripts import TranscriptWriter
from pytest_haico.errors import WireError
from pytest_haico.ledger.records import ErrorInfo, TurnRecord
from pytest_haico.ledger.times import Stopwatch
from pytest_haico.ledger.verdicts import Verdict, resolve_verdict
from pytest_haico.redact import Redactor

# After one of these the rest of the script is not sent: the backend is down or
# refusing, or the turns would run on a model the arm does not name (a real
# provider, perhaps, at real cost).
_STOPPING = frozenset({Verdict.SUBSTITUTED, Verdict.INFRA_ERROR, Verdict.RATE_LIMITED})
_THREAD_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "https://pypi.org/project/pytest-haico/")
_ERROR_BODY_CHARS = 300
# After the terminal event the stream is read to its end, so the connection goes
# back to the client's pool instead of being dropped (a new connection per turn
# costs more than the rest of the turn's client work). A backend that keeps the
# stream open gets this long, then the connection is closed.
_DRAIN_GRACE_S = 1.0


class ConversationProgress:
    """What a conversation has done so far, kept up to date while it runs.

    Pass one to `run_conversation`; when the conversation is cancelled (a drain),
    `interrupted_result` gives the finished turns, the one in flight and the
    verdict ``interrupted`` (or a verdict that outranks it, found earlier).
    """

    def __init__(self) -> None:
        self.clock = Stopwatch()
        self._turns: list[TurnRecord] = []
        self._answers: list[str] = []
        self._findings: list[Finding] = []
        self._current: TurnState | None = None

    @property
    def turns(self) -> tuple[TurnRecord, ...]:
        """The finished turns."""
        return tuple(self._turns)

    def interrupted_result(self) -> ConversationResult:
        """The result of a conversation that was cancelled before it ended."""
        turns, answers = list(self._turns), list(self._answers)
        if self._current is not None:
            turns.append(self._current.record())  # latency_s stays None: it never ended
            answers.append("")  # an answer cut short is none
        where = f"during turn {self._current.index + 1}" if self._current else "between turns"
        findings = [*self._findings, make_finding(Verdict.INTERRUPTED, where)]
        return self._result(findings, turns, answers)

    def _finish_turn(self, state: TurnState, findings: Iterable[Finding], *, answer: str) -> None:
        self._turns.append(state.record())
        self._answers.append(answer)
        self._findings.extend(findings)
        self._current = None

    def _result(
        self,
        findings: list[Finding] | None = None,
        turns: list[TurnRecord] | None = None,
        answers: list[str] | None = None,
    ) -> ConversationResult:
        findings = self._findings if findings is None else findings
        verdict = resolve_verdict(finding.verdict for finding in findings)
        error = next((f.error for f in findings if f.verdict is verdict), None)
        return ConversationResult(
            verdict=verdict,
            turns=tuple(self._turns if turns is None else turns),
            error=error,
            times=self.clock.read(),
            answers=tuple(self._answers if answers is None else answers),
        )


def make_thread_id(item_id: str, run_id: str, attempt: int) -> str:
    """A thread id unique per item attempt and stable across reruns of the same attempt."""
    return str(uuid.uuid5(_THREAD_NAMESPACE, f"{item_id}/{run_id}/{attempt}"))


@dataclass(frozen=True, kw_only=True)
class ConversationSetup:
    """What every conversation of an arm's run shares: the backend and its admin token, the
    model endpoint the backend is to call, the arm, the snapshot reader, the bounds, and
    what redacts and judges. ``turn_timeout_s`` bounds each turn's request and stream
    (None: the arm's ``run.turn_timeout_s``); ``snapshot_wait_s`` is how long a turn's
    ``workspace_snapshots`` row may take to appear; ``judge`` scores the turns'
    `expect: {judge: ...}`."""

    backend_url: str
    token: str = field(repr=False)
    endpoint_url: str
    arm: Arm
    snapshots: SnapshotReader
    turn_timeout_s: float | None = None
    connect_timeout_s: float = 10.0
    snapshot_wait_s: float = 5.0
    redactor: Redactor | None = None
    judge: Scorer | None = None


async def run_conversation(
    client: httpx.AsyncClient,
    setup: ConversationSetup,
    *,
    script: Script,
    thread_id: str,
    transcript_path: Path,
    transcript_header: Mapping[str, Any] | None = None,
    progress: ConversationProgress | None = None,
) -> ConversationResult:
    """Send the script's turns one after another and judge the conversation.

    ``transcript_header`` is the transcript's first line (`transcripts.transcript_header`).
    Cancellation propagates after the transcript is closed; ``progress`` then holds the
    partial conversation."""
    arm, token = setup.arm, setup.token
    turn_timeout_s = (
        arm.run.turn_timeout_s if setup.turn_timeout_s is None else setup.turn_timeout_s
    )
    conversation = _Conversation(
        client=client,
        arm=arm,
        url=wire.stream_url(setup.backend_url),
        headers=wire.build_headers(token),
        endpoint_url=setup.endpoint_url,
        snapshots=setup.snapshots,
        turn_timeout_s=turn_timeout_s,
        # The turn's deadline bounds the rest (asyncio.timeout, one per turn).
        http_timeout=httpx.Timeout(None, connect=min(setup.connect_timeout_s, turn_timeout_s)),
        snapshot_wait_s=setup.snapshot_wait_s,
        redactor=(setup.redactor or Redactor()).with_secrets(token),
        progress=ConversationProgress() if progress is None else progress,
        judge=setup.judge,
    )
    return await conversation.run(
        script, thread_id=thread_id, transcript_path=transcript_path, header=transcript_header
    )


@dataclass(kw_only=True, slots=True)
class _Conversation:
    client: httpx.AsyncClient
    arm: Arm
    url: str
    headers: dict[str, str]
    endpoint_url: str
    snapshots: SnapshotReader
    turn_timeout_s: float
    http_timeout: httpx.Timeout
    snapshot_wait_s: float
    redactor: Redactor
    progress: ConversationProgress
    judge: Scorer | None = None
    script_id: str = ""
    transcript: TranscriptWriter | None = None

    def _log(self, state: TurnState, kind: str, **fields: Any) -> None:
        assert self.transcript is not None
        # The moment is taken here; the writer formats it off the loop.
        self.transcript.append({"turn": state.index, "kind": kind, **fields}, at=time.time())

    async def run(
        self,
        script: Script,
        *,
        thread_id: str,
        transcript_path: Path,
        header: Mapping[str, Any] | None = None,
    ) -> ConversationResult:
        self.progress.clock.start()
        self.script_id = script.id
        self.transcript = TranscriptWriter(transcript_path, redactor=self.redactor, header=header)
        try:
            await self._run_turns(script, thread_id)
        except asyncio.CancelledError:
            if self.progress._current is not None:
                self._log(self.progress._current, "cancelled")
            raise
        finally:
            await self.transcript.aclose()
        message = self.transcript.failure()
        if message is not None:
            finding = make_finding(Verdict.INFRA_ERROR, message, kind="transcript")
            self.progress._findings.append(self._redacted(finding))
        return self.progress._result()

    def _redacted(self, finding: Finding) -> Finding:
        message = self.redactor.redact(finding.error.message)
        return Finding(finding.verdict, ErrorInfo(kind=finding.error.kind, message=message))

    async def _run_turns(self, script: Script, thread_id: str) -> None:
        # Where each script turn ran, to branch from it on its own thread with
        # the index the backend gave it.
        threads: list[str] = []
        indices: list[int] = []
        current = thread_id
        for index, turn in enumerate(script.turns):
            if turn.branch_from is None:
                send_thread, branch_from_turn = current, None
            else:
                send_thread = threads[turn.branch_from]
                branch_from_turn = indices[turn.branch_from]
            state = TurnState(
                index=index,
                thread_id=send_thread,
                branch_from=turn.branch_from,
                started=time.monotonic(),
            )
            self.progress._current = state
            findings = await self._run_turn(turn, state, branch_from_turn)
            answer = self.redactor.redact(state.answer)
            self.progress._finish_turn(state, findings, answer=answer)
            if any(finding.verdict in _STOPPING for finding in findings):
                return
            current = state.thread_id
            threads.append(state.thread_id)
            indices.append(state.snapshot_index)

    async def _run_turn(
        self, turn: Turn, state: TurnState, branch_from_turn: int | None
    ) -> list[Finding]:
        body = wire.build_query_body(
            self.arm,
            turn,
            thread_id=state.thread_id,
            branch_from_turn=branch_from_turn,
            endpoint_url=self.endpoint_url,
        )
        self._log(state, "request", body=body)
        failure = await self._stream(state, body)
        if state.latency_s is None:  # set at the terminal event when there was one
            state.latency_s = time.monotonic() - state.started
        if failure is not None:
            findings = [failure]
        else:
            findings = judge_turn(turn, state, recursion_limit=self.arm.agent.recursion_limit)
            # What an expectation saw quotes the model, which may quote a secret.
            state.expectations = [
                result.model_copy(update={"seen": self.redactor.redact(result.seen)})
                for result in state.expectations
            ]
            snapshot_finding = await self._check_snapshot(state)
            findings += [snapshot_finding] if snapshot_finding else []
            if turn.expect and turn.expect.judge and not {f.verdict for f in findings} & _STOPPING:
                where = {"arm": self.arm.name, "script": self.script_id}
                findings += await score_judge(self.judge, turn, state, self.redactor, **where)
        findings = [self._redacted(finding) for finding in findings]
        for finding in findings:
            self._log(state, "finding", verdict=finding.verdict, error=finding.error.model_dump())
        return findings

    async def _stream(self, state: TurnState, body: dict[str, Any]) -> Finding | None:
        """Send one turn and read its events into ``state``; a `Finding` when it failed."""
        infra = Verdict.INFRA_ERROR  # every failure of the request or the stream
        responded = False
        try:
            async with (
                asyncio.timeout(self.turn_timeout_s) as deadline,
                self.client.stream(
                    "POST", self.url, headers=self.headers, json=body, timeout=self.http_timeout
                ) as response,
            ):
                responded = True
                elapsed = time.monotonic() - state.started
                self._log(state, "response", status=response.status_code, elapsed_s=elapsed)
                if not response.is_success:
                    return await self._status_finding(response)
                _check_content_type(response)
                decoder = SSEDecoder()
                async for chunk in response.aiter_bytes():
                    # After the terminal event the rest is only read to its end.
                    if state.terminal is None:
                        self._receive_chunk(state, decoder, chunk, deadline)
        except TimeoutError:
            if state.terminal is None:
                message = f"no end of turn within {self.turn_timeout_s:g} s"
                return make_finding(infra, message, kind="timeout")
        except WireError as exc:
            return make_finding(infra, str(exc), kind="protocol")
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            return make_finding(infra, f"{self.url}: {_describe(exc)}", kind="unreachable")
        except httpx.RequestError as exc:
            if state.terminal is None:  # a failure after the end of the turn costs nothing
                kind = "broken_stream" if responded else "unreachable"
                return make_finding(infra, f"{self.url}: {_describe(exc)}", kind=kind)
        return judge_stream_end(state)

    def _receive_chunk(
        self, state: TurnState, decoder: SSEDecoder, chunk: bytes, deadline: asyncio.Timeout
    ) -> None:
        for data in decoder.feed(chunk):
            # An event with an empty data line carries nothing; what follows the
            # terminal event is not part of the turn.
            if data and state.terminal is None:
                self._receive(state, data)
        if state.terminal is not None:
            grace = asyncio.get_running_loop().time() + _DRAIN_GRACE_S
            deadline.reschedule(min(grace, deadline.when() or grace))

    def _receive(self, state: TurnState, data: str) -> None:
        elapsed = time.monotonic() - state.started
        if state.first_event_s is None:
            state.first_event_s = elapsed
        try:
            payload = wire.parse_payload(data)
        except WireError:
            self._log(state, "event", elapsed_s=elapsed, raw=data)
            raise
        self._log(state, "event", elapsed_s=elapsed, data=payload)
        state.observe(wire.parse_event(payload))
        if state.terminal is not None:
            state.latency_s = elapsed

    async def _status_finding(self, response: httpx.Response) -> Finding:
        snippet = bytearray()
        async for chunk in response.aiter_bytes():
            snippet += chunk
            if len(snippet) >= _ERROR_BODY_CHARS:
                break
        text = snippet.decode("utf-8", "replace")[:_ERROR_BODY_CHARS].strip()
        message = f"HTTP {response.status_code} from {self.url}" + (f": {text}" if text else "")
        if response.status_code == 429:
            retry_after = response.headers.get("retry-after")
            if retry_after:
                message += f" (Retry-After: {retry_after})"
            return make_finding(Verdict.RATE_LIMITED, message)
        return make_finding(Verdict.INFRA_ERROR, message, kind="http_status")

    async def _check_snapshot(self, state: TurnState) -> Finding | None:
        index = state.snapshot_index
        try:
            snapshot = await read_snapshot(
                self.snapshots, state.thread_id, index, wait_s=self.snapshot_wait_s
            )
        except (TimeoutError, psycopg.Error, OSError) as exc:
            message = (
                f"reading workspace_snapshots for thread {state.thread_id} turn_index {index} "
                f"(turn {state.index + 1})"
            )
            return make_finding(Verdict.INFRA_ERROR, f"{message}: {exc!r}", kind="snapshot")
        self._log(state, "snapshot", snapshot=None if snapshot is None else _fields(snapshot))
        state.snapshot = snapshot
        return judge_snapshot(state, self.arm, wait_s=self.snapshot_wait_s)


def _check_content_type(response: httpx.Response) -> None:
    content_type = response.headers.get("content-type", "").partition(";")[0].strip()
    if content_type.lower() != "text/event-stream":
        raise WireError(f"the response is not an event stream: Content-Type {content_type!r}")


def _fields(snapshot: Snapshot) -> dict[str, Any]:
    # Shallow, unlike dataclasses.asdict (which deep-copies): the writer only reads it.
    return {name: getattr(snapshot, name) for name in Snapshot.__slots__}


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
