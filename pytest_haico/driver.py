"""One scripted conversation over the backend's SSE API, its per-turn metrics and its verdict."""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections.abc import Iterable
from contextlib import aclosing
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import psycopg
from httpx_sse import SSEError, aconnect_sse

from pytest_haico import wire
from pytest_haico.experiment import Arm, Script, Turn
from pytest_haico.records import ErrorInfo, TurnRecord
from pytest_haico.redact import Redactor
from pytest_haico.snapshots import VLLM_PROVIDER, Snapshot, SnapshotReader, read_snapshot
from pytest_haico.transcripts import TranscriptWriter
from pytest_haico.verdicts import Verdict, resolve_verdict

# After one of these the rest of the script is not sent: the backend is down or
# refusing, or the turns would run on a model the arm does not name (a real
# provider, perhaps, at real cost).
_STOPPING = frozenset({Verdict.SUBSTITUTED, Verdict.INFRA_ERROR, Verdict.RATE_LIMITED})
_THREAD_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "https://pypi.org/project/pytest-haico/")
_ERROR_BODY_CHARS = 300


@dataclass(frozen=True, slots=True)
class Finding:
    """One reason for a verdict, found in one turn."""

    verdict: Verdict
    error: ErrorInfo


def _finding(verdict: Verdict, message: str, *, kind: str | None = None) -> Finding:
    return Finding(verdict, ErrorInfo(kind=kind or verdict.value, message=message))


@dataclass(frozen=True, slots=True)
class ConversationResult:
    """How a conversation ended: its verdict, per-turn metrics and the winning reason."""

    verdict: Verdict
    turns: tuple[TurnRecord, ...]
    error: ErrorInfo | None
    started_at: datetime
    finished_at: datetime
    duration_s: float


@dataclass(slots=True)
class _TurnState:
    index: int
    thread_id: str
    branch_from: int | None
    started: float
    backend_index: int | None = None
    first_event_s: float | None = None
    latency_s: float | None = None
    steps: list[wire.Step] = field(default_factory=list)
    terminal: wire.TerminalEvent | None = None
    snapshot: Snapshot | None = None

    def observe(self, event: wire.BackendEvent) -> None:
        if isinstance(event, wire.OtherEvent):
            return
        # A branch may be answered on a new thread: follow what the backend reports.
        if event.thread_id:
            self.thread_id = event.thread_id
        if event.turn_index is not None:
            self.backend_index = event.turn_index
        if isinstance(event, wire.StepEvent):
            self.steps.append(event.step)
        else:
            self.terminal = event

    def record(self) -> TurnRecord:
        usage = self.terminal.usage if isinstance(self.terminal, wire.CompleteEvent) else None
        return TurnRecord(
            index=self.index,
            thread_id=self.thread_id,
            branch_from=self.branch_from,
            latency_s=self.latency_s,
            first_event_s=self.first_event_s,
            steps=len(self.steps),
            tool_calls=sum(len(step.tool_calls) for step in self.steps),
            tool_errors=sum(step.has_tool_error for step in self.steps),
            tokens_in=usage.tokens_in if usage else None,
            tokens_out=usage.tokens_out if usage else None,
            provider=self.snapshot.provider if self.snapshot else None,
            model_id=self.snapshot.model_id if self.snapshot else None,
            snapshot_id=self.snapshot.snapshot_id if self.snapshot else None,
        )


class ConversationProgress:
    """What a conversation has done so far, kept up to date while it runs.

    Pass one to `run_conversation`; when the conversation is cancelled (a drain),
    `interrupted_result` gives the finished turns, the one in flight and the
    verdict ``interrupted`` (or a verdict that outranks it, found earlier).
    """

    def __init__(self) -> None:
        self.started_at: datetime | None = None
        self._started = 0.0
        self._turns: list[TurnRecord] = []
        self._findings: list[Finding] = []
        self._current: _TurnState | None = None

    @property
    def turns(self) -> tuple[TurnRecord, ...]:
        """The finished turns."""
        return tuple(self._turns)

    def interrupted_result(self) -> ConversationResult:
        """The result of a conversation that was cancelled before it ended."""
        turns = list(self._turns)
        if self._current is not None:
            turns.append(self._current.record())  # latency_s stays None: it never ended
        where = f"during turn {self._current.index}" if self._current else "between turns"
        return self._result([*self._findings, _finding(Verdict.INTERRUPTED, where)], turns)

    def _begin(self) -> None:
        self.started_at = datetime.now(UTC)
        self._started = time.monotonic()

    def _finish_turn(self, state: _TurnState, findings: Iterable[Finding]) -> None:
        self._turns.append(state.record())
        self._findings.extend(findings)
        self._current = None

    def _result(
        self, findings: list[Finding] | None = None, turns: list[TurnRecord] | None = None
    ) -> ConversationResult:
        findings = self._findings if findings is None else findings
        verdict = resolve_verdict(finding.verdict for finding in findings)
        error = next((f.error for f in findings if f.verdict is verdict), None)
        return ConversationResult(
            verdict=verdict,
            turns=tuple(self._turns if turns is None else turns),
            error=error,
            started_at=self.started_at or datetime.now(UTC),
            finished_at=datetime.now(UTC),
            duration_s=time.monotonic() - self._started,
        )


def make_thread_id(item_id: str, run_id: str, attempt: int) -> str:
    """A thread id unique per item attempt and stable across reruns of the same attempt."""
    return str(uuid.uuid5(_THREAD_NAMESPACE, f"{item_id}/{run_id}/{attempt}"))


async def run_conversation(
    client: httpx.AsyncClient,
    *,
    backend_url: str,
    token: str,
    endpoint_url: str,
    arm: Arm,
    script: Script,
    thread_id: str,
    transcript_path: Path,
    snapshots: SnapshotReader,
    turn_timeout_s: float | None = None,
    connect_timeout_s: float = 10.0,
    snapshot_wait_s: float = 5.0,
    redactor: Redactor | None = None,
    progress: ConversationProgress | None = None,
) -> ConversationResult:
    """Send the script's turns one after another and judge the conversation.

    ``turn_timeout_s`` bounds each turn's request and stream (default: the arm's
    ``run.turn_timeout_s``); ``snapshot_wait_s`` is how long a turn's
    ``workspace_snapshots`` row may take to appear. Cancellation propagates after
    the transcript is closed; ``progress`` then holds the partial conversation.
    """
    conversation = _Conversation(
        client=client,
        arm=arm,
        url=wire.stream_url(backend_url),
        headers=wire.build_headers(token),
        endpoint_url=endpoint_url,
        snapshots=snapshots,
        turn_timeout_s=arm.run.turn_timeout_s if turn_timeout_s is None else turn_timeout_s,
        connect_timeout_s=connect_timeout_s,
        snapshot_wait_s=snapshot_wait_s,
        redactor=(redactor or Redactor()).with_secrets(token),
        progress=ConversationProgress() if progress is None else progress,
    )
    return await conversation.run(script, thread_id=thread_id, transcript_path=transcript_path)


@dataclass(kw_only=True, slots=True)
class _Conversation:
    client: httpx.AsyncClient
    arm: Arm
    url: str
    headers: dict[str, str]
    endpoint_url: str
    snapshots: SnapshotReader
    turn_timeout_s: float
    connect_timeout_s: float
    snapshot_wait_s: float
    redactor: Redactor
    progress: ConversationProgress
    transcript: TranscriptWriter | None = None

    def _log(self, state: _TurnState, kind: str, **fields: Any) -> None:
        assert self.transcript is not None
        line = {"at": datetime.now(UTC).isoformat(), "turn": state.index, "kind": kind}
        self.transcript.append({**line, **fields})

    async def run(
        self, script: Script, *, thread_id: str, transcript_path: Path
    ) -> ConversationResult:
        self.progress._begin()
        self.transcript = TranscriptWriter(transcript_path, redactor=self.redactor)
        try:
            await self._run_turns(script, thread_id)
        except asyncio.CancelledError:
            if self.progress._current is not None:
                self._log(self.progress._current, "cancelled")
            raise
        finally:
            await self.transcript.aclose()
        if self.transcript.error is not None:
            message = f"writing the transcript {transcript_path} failed: {self.transcript.error}"
            finding = _finding(Verdict.INFRA_ERROR, message, kind="transcript")
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
            state = _TurnState(
                index=index,
                thread_id=send_thread,
                branch_from=turn.branch_from,
                started=time.monotonic(),
            )
            self.progress._current = state
            findings = await self._run_turn(turn, state, branch_from_turn)
            self.progress._finish_turn(state, findings)
            if any(finding.verdict in _STOPPING for finding in findings):
                return
            current = state.thread_id
            threads.append(state.thread_id)
            indices.append(index if state.backend_index is None else state.backend_index)

    async def _run_turn(
        self, turn: Turn, state: _TurnState, branch_from_turn: int | None
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
        state.latency_s = time.monotonic() - state.started
        if failure is not None:
            findings = [failure]
        else:
            findings = _judge_turn(turn, state, recursion_limit=self.arm.agent.recursion_limit)
            snapshot_finding = await self._check_snapshot(state)
            findings += [snapshot_finding] if snapshot_finding else []
        findings = [self._redacted(finding) for finding in findings]
        for finding in findings:
            self._log(state, "finding", verdict=finding.verdict, error=finding.error.model_dump())
        return findings

    async def _stream(self, state: _TurnState, body: dict[str, Any]) -> Finding | None:
        """Send one turn and read its events into ``state``; a `Finding` when it failed."""
        infra = Verdict.INFRA_ERROR  # every failure of the request or the stream
        responded = False
        timeout = httpx.Timeout(None, connect=min(self.connect_timeout_s, self.turn_timeout_s))
        try:
            async with (
                asyncio.timeout(self.turn_timeout_s),
                aconnect_sse(
                    self.client,
                    "POST",
                    self.url,
                    headers=dict(self.headers),
                    json=body,
                    timeout=timeout,
                ) as source,
            ):
                response = source.response
                responded = True
                elapsed = time.monotonic() - state.started
                self._log(state, "response", status=response.status_code, elapsed_s=elapsed)
                if not response.is_success:
                    return await self._status_finding(response)
                async with aclosing(source.aiter_sse()) as events:
                    async for sse in events:
                        # httpx-sse dispatches a data-less event after an `id:` or
                        # `event:` line; the SSE spec drops those, and so do we.
                        if not sse.data:
                            continue
                        self._receive(state, sse.data)
                        if state.terminal is not None:
                            break  # a backend that keeps the stream open must not hang us
        except TimeoutError:
            message = f"no end of turn within {self.turn_timeout_s:g} s"
            return _finding(infra, message, kind="timeout")
        except (SSEError, wire.WireError) as exc:
            # First: httpx-sse's SSEError (a wrong content type) is an httpx.TransportError.
            return _finding(infra, str(exc), kind="protocol")
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            return _finding(infra, f"{self.url}: {_describe(exc)}", kind="unreachable")
        except httpx.RequestError as exc:
            kind = "broken_stream" if responded else "unreachable"
            return _finding(infra, f"{self.url}: {_describe(exc)}", kind=kind)
        terminal = state.terminal
        if terminal is None:
            message = (
                f"the stream ended after {len(state.steps)} steps without a complete or "
                "error event (cut, or the backend died mid-turn)"
            )
            return _finding(infra, message, kind="broken_stream")
        if isinstance(terminal, wire.ErrorEvent) and not terminal.is_recursion_limit:
            message = f"the backend reported an error of kind {terminal.kind!r}: {terminal.error}"
            return _finding(infra, message, kind=f"backend_{terminal.kind}")
        return None

    def _receive(self, state: _TurnState, data: str) -> None:
        elapsed = time.monotonic() - state.started
        if state.first_event_s is None:
            state.first_event_s = elapsed
        try:
            payload = wire.parse_payload(data)
        except wire.WireError:
            self._log(state, "event", elapsed_s=elapsed, raw=data)
            raise
        self._log(state, "event", elapsed_s=elapsed, data=payload)
        state.observe(wire.parse_event(payload))

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
            return _finding(Verdict.RATE_LIMITED, message)
        return _finding(Verdict.INFRA_ERROR, message, kind="http_status")

    async def _check_snapshot(self, state: _TurnState) -> Finding | None:
        index = state.index if state.backend_index is None else state.backend_index
        try:
            snapshot = await read_snapshot(
                self.snapshots, state.thread_id, index, wait_s=self.snapshot_wait_s
            )
        except (TimeoutError, psycopg.Error, OSError) as exc:
            message = f"reading workspace_snapshots for thread {state.thread_id} turn {index}"
            return _finding(Verdict.INFRA_ERROR, f"{message}: {exc!r}", kind="snapshot")
        self._log(
            state, "snapshot", snapshot=None if snapshot is None else dataclasses.asdict(snapshot)
        )
        state.snapshot = snapshot
        if snapshot is None:
            # After a recursion-limit error the backend may have persisted nothing.
            if isinstance(state.terminal, wire.ErrorEvent):
                return None
            message = (
                f"no workspace_snapshots row for thread {state.thread_id} turn {index} after "
                f"{self.snapshot_wait_s:g} s: which model served the turn cannot be checked"
            )
            return _finding(Verdict.INFRA_ERROR, message, kind="snapshot")
        if snapshot.is_served_by(provider=VLLM_PROVIDER, model_id=self.arm.served_name):
            return None
        message = (
            f"turn {state.index} was served by provider {snapshot.provider!r}, model "
            f"{snapshot.model_id!r} (snapshot {snapshot.snapshot_id}); the arm expects "
            f"{VLLM_PROVIDER!r}, {self.arm.served_name!r}"
        )
        return _finding(Verdict.SUBSTITUTED, message)


def _judge_turn(turn: Turn, state: _TurnState, *, recursion_limit: int) -> list[Finding]:
    """The model-behaviour verdicts of a turn that ended with a complete or error event."""
    findings: list[Finding] = []
    terminal, steps = state.terminal, state.steps
    final = steps[-1] if steps else None
    reasons = []
    if isinstance(terminal, wire.ErrorEvent) and terminal.is_recursion_limit:
        reasons.append(f"the backend reported an error of kind 'recursion_limit': {terminal.error}")
    if isinstance(terminal, wire.CompleteEvent) and terminal.recursion_limit_reached:
        reasons.append("the backend flagged recursion_limit_reached")
    if final is not None and final.is_canned_recursion_reply:
        reasons.append(f"the final step is the framework's canned reply {final.text.strip()!r}")
    if len(steps) >= recursion_limit:
        reasons.append(f"it took {len(steps)} steps, the limit is {recursion_limit}")
    if reasons:
        message = f"turn {state.index} hit the recursion limit ({recursion_limit}): "
        findings.append(_finding(Verdict.RECURSION_LIMIT, message + "; ".join(reasons)))
    elif final is None:
        findings.append(_finding(Verdict.BLANK_TURN, f"turn {state.index} ended without any step"))
    elif not final.text.strip() and not final.tool_calls:
        message = (
            f"turn {state.index} ended without an answer: the final step is empty, no tool call"
        )
        findings.append(_finding(Verdict.BLANK_TURN, message))
    # Only `artifact: true` is checked; `false` states no requirement.
    if turn.expect and turn.expect.artifact and not any(step.has_artifact for step in steps):
        message = f"turn {state.index} expected an artifact and no step produced one"
        findings.append(_finding(Verdict.EXPECTATION_FAILED, message))
    return findings


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
