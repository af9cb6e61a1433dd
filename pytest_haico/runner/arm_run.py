"""One arm's live session: its stack and its conversations, started once and stopped once."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeVar

import httpx

from pytest_haico.config.cluster_env import ClusterEnv
from pytest_haico.config.experiment import Arm
from pytest_haico.config.settings import Profile
from pytest_haico.driver.conversation import (
    ConversationProgress,
    ConversationResult,
    make_thread_id,
    run_conversation,
)
from pytest_haico.driver.snapshots import PostgresSnapshotReader
from pytest_haico.driver.transcripts import transcript_header
from pytest_haico.errors import DumpError, LedgerWriteError, StackError
from pytest_haico.gates.result import GateResult, arun_gates
from pytest_haico.ledger.recorder import ItemAttempt, Recorder
from pytest_haico.ledger.records import ErrorInfo
from pytest_haico.ledger.rundir import ArmPaths, RunClaim
from pytest_haico.ledger.verdicts import Verdict, resolve_verdict
from pytest_haico.provenance.dumps import DatabaseDumps
from pytest_haico.provenance.runconfig import (
    RunConfig,
    model_server_metrics,
    model_server_values,
    previous_run,
)
from pytest_haico.redact import Redactor
from pytest_haico.runner.breaker import CircuitBreaker
from pytest_haico.runner.finished import Conversation as Conversation  # re-exported
from pytest_haico.runner.loop import Runner
from pytest_haico.runner.preflight import GateLog
from pytest_haico.runner.stack_gates import dynamic_gates, make_canary
from pytest_haico.runner.walltime import WalltimeAdmission
from pytest_haico.runner.watch import ServiceDeath, ServiceWatch
from pytest_haico.stack.arm_stack import build_arm_stack
from pytest_haico.stack.attached import AttachedStack
from pytest_haico.stack.kept import KeptState
from pytest_haico.stack.orchestrator import ServiceTiming
from pytest_haico.stack.profiles import Stack
from pytest_haico.stack.request import BackendCommand, ModelEndpoint, StackRequest
from pytest_haico.stack.service_log import read_log_tail

_log = logging.getLogger(__name__)
T = TypeVar("T")
# How long a model server whose /health fails after a model error may take to exit.
MODEL_EXIT_GRACE_S = 5.0


@dataclass(frozen=True)
class HaicoStack:
    """What tests see of an arm's running stack; secrets stay out of its repr."""

    arm: str
    backend_url: str
    llm_url: str
    model_endpoint: str
    log_paths: Mapping[str, Path]
    ports: Mapping[str, int]
    timings: Mapping[str, ServiceTiming]
    readonly_dsn: str = field(repr=False)
    admin_token: str = field(repr=False)


class ArmRun:
    """The arm's stack, an event-loop runner keeping its conversations in flight, and their
    records. `start` and `stop` run on pytest's main thread (services must be spawned there).
    """

    def __init__(
        self,
        arm: Arm,
        *,
        concurrency: int,
        recorder: Recorder,
        breaker: CircuitBreaker,
        on_stop: Callable[[str], None],
        on_admission_stop: Callable[[str], None],
        dump_interval_s: float,
        admission: WalltimeAdmission,
        gate_log: GateLog,
        gates_only: bool = False,
        backend_command: BackendCommand | None = None,
        model_endpoint: ModelEndpoint | None = None,
        provenance: Callable[[], Mapping[str, str]] = dict,
        profile: Profile = Profile.LOCAL,
        site: ClusterEnv | None = None,
        backend_image: str | None = None,
        kept: KeptState | None = None,
    ) -> None:
        self.arm = arm
        self.concurrency = concurrency
        self.recorder = recorder
        self.breaker = breaker
        self.on_stop = on_stop
        self.on_admission_stop = on_admission_stop
        self.dump_interval_s = dump_interval_s
        self.admission = admission  # the static gates, which passed, ran with it
        self.gate_log = gate_log
        self.gates_only = gates_only
        self.backend_command = backend_command
        self.model_endpoint = model_endpoint
        self.provenance = provenance  # what run-config records before the stack starts
        self.profile = profile
        self.site = site  # cluster.env, for the cluster profile
        self.backend_image = backend_image  # --haico-backend-image (cluster profile)
        self.kept = kept  # --haico-attach: the stack `haico stack up` keeps, never stopped here
        self.run_config: RunConfig | None = None
        self.provenance_changes: list[str] = []  # since the arm's previous run
        self.dumps: DatabaseDumps | None = None
        self.dump_failure: str | None = None
        self.claim: RunClaim = recorder.claim(arm.name)
        self.paths: ArmPaths = recorder.paths(arm.name)
        self.stack: Stack | AttachedStack | None = None
        self.view: HaicoStack | None = None
        self.redactor = Redactor()
        self._runner: Runner[ItemAttempt, ConversationResult, Conversation] | None = None
        self._submitted: set[ItemAttempt] = set()
        self._watch: ServiceWatch | None = None
        self._client: httpx.AsyncClient | None = None
        self._snapshots: PostgresSnapshotReader | None = None
        self._stopped = False
        self._start_interrupted: str | None = None
        self._started_at: float | None = None
        self._stopped_at: float | None = None

    @property
    def stopped(self) -> bool:
        return self._stopped

    @property
    def in_flight(self) -> int:
        return self._runner.in_flight if self._runner is not None else 0

    @property
    def elapsed_s(self) -> float | None:
        """Seconds from the start of the stack to its stop (or to now)."""
        if self._started_at is None:
            return None
        return (self._stopped_at or time.monotonic()) - self._started_at

    def start(self) -> HaicoStack:
        """Start the stack (the static gates passed), run the dynamic gates, then start the
        dumps, the service watch and the conversations' runner; leak-proof (a failure stops
        what started). With `gates_only` it stops short after the dynamic gates: the caller
        then stops the stack, and no conversation runs.

        Every failure to start is a `StackError`, whatever raised it; a failed gate is its
        `GateFailedError`. The gate log's gates.json holds every gate run.
        """
        self._started_at = time.monotonic()
        try:
            return self._start()
        except StackError:
            raise
        except Exception as exc:
            raise StackError(self.redactor.redact(f"{type(exc).__name__}: {exc}")) from exc

    def _start(self) -> HaicoStack:
        arm = self.arm
        self._check_start_interrupted()
        stack: Stack | AttachedStack
        if self.kept is not None:
            stack = AttachedStack(self.kept)
        else:
            stack = build_arm_stack(
                StackRequest(
                    arm=arm,
                    run_dir=self.claim.path,
                    profile=self.profile,
                    site=self.site,
                    backend_image=self.backend_image,
                    backend_command=self.backend_command,
                    model_endpoint=self.model_endpoint,
                    log_mode=self.recorder.file_mode,
                )
            )
        self.stack = stack
        self.redactor = Redactor(stack.secrets)
        self.recorder.use_redactor(arm.name, self.redactor)
        if self._start_interrupted is not None:  # before the stack could see it
            stack.interrupt(self._start_interrupted)
        stack.start()
        try:
            self._check_start_interrupted()
            runner: Runner[ItemAttempt, ConversationResult, Conversation] = Runner(
                concurrency=self.concurrency,
                finish=self._finish,
                admit=self._admit,
                name=f"haico-{arm.name}",
            )
            self._runner = runner
            runner.start()
            self._start_call(runner, self._open)
            gates = self._start_call(runner, self._dynamic_gates)
            self.gate_log.check(gates, redactor=self.redactor)
            self._check_start_interrupted()
            view = _view(arm.name, stack)
            if self.gates_only:
                self.view = view
                return view
            if isinstance(stack, Stack):  # a kept stack's supervisor runs its dumps
                self.dumps = DatabaseDumps(
                    stack.postgres,
                    self.claim.path / "dumps",
                    interval_s=self.dump_interval_s,
                    file_mode=self.recorder.file_mode,
                )
                self.dumps.start_periodic()
            self._watch = ServiceWatch(
                lambda: stack.processes,
                busy=lambda: runner.in_flight > 0,
                on_death=self._on_death,
                name=f"haico-{arm.name}-watch",
            )
            self._watch.start()
            self._record_provenance(stack)
            self._check_start_interrupted()
        except BaseException:
            self.stop()
            raise
        self.view = view
        return view

    def interrupt_start(self, reason: str) -> None:
        """End a `start` in progress at its next step with a `StackError`, having stopped
        what it started: the stack's start loop within a poll interval, a gate under way
        at once. Safe from a signal handler: it sets flags and cancels futures, so nothing
        is raised into whatever the main thread was doing (a Popen, a lock)."""
        self._start_interrupted = reason
        if self.stack is not None:
            self.stack.interrupt(reason)
        if self._runner is not None:
            self._runner.cancel_calls()

    def _check_start_interrupted(self) -> None:
        if self._start_interrupted is not None:
            raise StackError(f"{self._start_interrupted}: the start was interrupted")

    def _start_call(
        self,
        runner: Runner[ItemAttempt, ConversationResult, Conversation],
        factory: Callable[[], Awaitable[T]],
    ) -> T:
        """`runner.call` during the start, which `interrupt_start` cancels."""
        self._check_start_interrupted()
        return runner.call(factory)

    def submit(self, state: ItemAttempt) -> None:
        """Queue the item's conversation; it starts as soon as a slot is free."""
        runner = self._require_runner()
        self._submitted.add(state)
        runner.submit(state, lambda: self._converse(state))

    def wait(self, state: ItemAttempt) -> Conversation:
        """Block until the item's conversation ended and its record is on disk.

        An item the plan did not queue (its marks said pytest would skip it) is queued now.
        """
        if state not in self._submitted:
            self.submit(state)
        return self._require_runner().wait(state)

    def stop(self, *, final_dump: bool = True) -> None:
        """Stop the stack; conversations still in flight are cancelled and recorded
        interrupted at once (whatever stops a run early wants it stopped now). The final
        pg_dump runs while Postgres is still up, unless `final_dump` is off (SIGTERM: the
        newest periodic dump is what survives).

        Exactly once; cleanup problems are logged, never raised over the original error.
        """
        if self._stopped:
            return
        self._stopped = True
        try:
            self._stop_conversations()
            if final_dump:
                self._final_provenance()
            self._dump_last(final_dump)
        finally:
            if self.stack is not None:
                self.stack.stop()
            self._stopped_at = time.monotonic()

    def was_admitted(self, state: ItemAttempt) -> bool:
        """Whether the item's conversation was started (it may have ended since)."""
        return self._runner is not None and self._runner.was_admitted(state)

    def stop_admitting(self, reason: str) -> None:
        """Start no more conversations; those in flight go on. Safe from a signal handler."""
        if self._runner is not None:
            self._runner.stop_admitting(reason)

    def cancel_after(self, delay: float, reason: str) -> None:
        """Start no more conversations; cancel those still in flight `delay` seconds from
        now (recorded interrupted). Safe from a signal handler."""
        if self._runner is not None:
            self._runner.cancel_after(delay, reason)

    def cancel_in_flight(self, reason: str) -> None:
        """End the conversations in flight now (recorded interrupted). Safe from a signal
        handler."""
        if self._runner is not None:
            self._runner.cancel_in_flight(reason)

    def abort_dumps(self) -> None:
        """No more pg_dumps; the one running is killed. Safe from a signal handler."""
        if self.dumps is not None:
            self.dumps.abort()

    def _record_provenance(self, stack: Stack | AttachedStack) -> None:
        """run-config.env/.json: the knobs, the host, the versions, the ports, the model
        server's own account; and what changed since the arm's previous run."""
        config = RunConfig(
            self.claim.path, redactor=self.redactor, file_mode=self.recorder.file_mode
        )
        ports = stack.ports
        config.update(self.provenance())
        config.update(
            {
                "POSTGRES_VERSION": stack.postgres_version,
                "POSTGRES_PORT": str(ports.get("postgres", "")),
                "VLLM_PORT": str(ports.get("llm", "")),
                "BACKEND_PORT": str(ports.get("backend", "")),
                **({"PHOENIX_PORT": str(ports["phoenix"])} if "phoenix" in ports else {}),
                "MODEL_ENDPOINT": stack.model_endpoint,
            }
        )
        # The haico-owned configuration the backend was given (cluster profile; no secret).
        config.update({f"BACKEND_CONFIG_{key}": v for key, v in stack.backend_config.items()})
        if isinstance(stack, AttachedStack):  # where its services' logs and dumps are
            config.update({"KEPT_STACK": str(stack.state.directory)})
        values, details = model_server_values(stack.llm_url, stack.api_key)
        config.update(values)
        for key, value in details.items():
            config.detail(key, value)
        config.detail("metrics_start", model_server_metrics(stack.llm_url))
        config.write()
        self.run_config = config
        earlier = previous_run(self.claim.path.parent, self.claim.path)
        if earlier is not None:
            self.provenance_changes = [
                f"since run {earlier.name}: {change}" for change in config.changed_since(earlier)
            ]

    def _final_provenance(self) -> None:
        """The model server's metrics at the arm's end: requests still running were
        abandoned but are still generating."""
        if self.run_config is None or self.stack is None:
            return
        try:
            self.run_config.detail("metrics_end", model_server_metrics(self.stack.llm_url))
            self.run_config.write()
        except OSError as exc:
            _log.warning("haico: arm %s: run-config not updated: %s", self.arm.name, exc)

    def _stop_conversations(self) -> None:
        if self._watch is not None:
            self._watch.stop()
        runner = self._runner
        if runner is None:
            return
        try:
            runner.drain(0, reason="the run is stopping")
            runner.call(self._close, timeout=10)
        except Exception:  # the stack must still stop
            _log.exception("haico: stopping the conversations of arm %s", self.arm.name)
        finally:
            runner.close()

    def _dump_last(self, final_dump: bool) -> None:
        dumps = self.dumps
        if dumps is None:
            return
        if not final_dump:
            dumps.abort()
            return
        dumps.stop_periodic()
        death = self._watch.death if self._watch is not None else None
        if death is not None and death.service == "postgres":
            self.dump_failure = "no final dump: postgres had died"
            return
        try:
            dumps.dump("final")
        except DumpError as exc:
            self.dump_failure = f"the final dump failed: {exc}"
            _log.warning("haico: arm %s: %s", self.arm.name, self.dump_failure)

    def log_tail(self, service: str) -> str:
        """The last lines of a service's log, redacted."""
        stack = self.stack
        if stack is None or service not in stack.log_paths:
            return ""
        return read_log_tail(stack.log_paths[service], secrets=stack.secrets)

    # -- on the runner's loop -----------------------------------------------------------

    def _admit(self, state: ItemAttempt) -> str | None:
        """Walltime admission: no new conversation that the job's remaining time cannot
        cover; the run then lets the in-flight ones finish and stops (exit 75)."""
        reason = self.admission.refusal(state.spec.stratum)
        if reason is not None:
            self.on_admission_stop(reason)
        return reason

    async def _open(self) -> None:
        stack = self._require_stack()
        # A cluster's proxy settings must never apply to loopback. One kept-alive
        # connection per conversation in flight; expiring before uvicorn's 5 s idle
        # timeout, so a turn is never sent on a connection the server is closing.
        limits = httpx.Limits(
            max_connections=None,
            max_keepalive_connections=self.concurrency,
            keepalive_expiry=3.0,
        )
        self._client = httpx.AsyncClient(trust_env=False, timeout=None, limits=limits)
        try:
            self._snapshots = await PostgresSnapshotReader.connect(stack.readonly_dsn)
        except Exception as exc:
            message = f"the snapshot connection to postgres failed: {type(exc).__name__}: {exc}"
            raise StackError(self.redactor.redact(message)) from exc

    async def _dynamic_gates(self) -> tuple[GateResult, ...]:
        """The model server's and the backend's gates, in DESIGN's order, on this loop."""
        stack = self._require_stack()
        async with httpx.AsyncClient(trust_env=False) as client:
            assert self._snapshots is not None
            canary = make_canary(
                client,
                backend_url=stack.backend_url,
                token=stack.admin_token,
                endpoint_url=stack.model_endpoint,
                arm=self.arm,
                snapshots=self._snapshots,
                transcripts=self.claim.path,
                redactor=self.redactor,
            )
            gates = dynamic_gates(client, stack, self.arm, canary)
            return await arun_gates(gates, redactor=self.redactor)

    async def _close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
        if self._snapshots is not None:
            await self._snapshots.aclose()

    async def _converse(self, state: ItemAttempt) -> ConversationResult:
        stack = self._require_stack()
        assert self._client is not None and self._snapshots is not None
        spec = state.spec
        run_id = self.claim.run_id
        progress = ConversationProgress()
        thread_id = make_thread_id(spec.item_id, run_id, state.attempt)
        header = transcript_header(
            item_id=spec.item_id,
            run_id=run_id,
            attempt=state.attempt,
            arm=spec.arm.name,
            script=spec.script.id,
            repeat=spec.repeat,
            nodeid=state.nodeid,
            thread_id=thread_id,
            started_at=datetime.now(UTC).isoformat(timespec="microseconds"),
        )
        try:
            result = await run_conversation(
                self._client,
                backend_url=stack.backend_url,
                token=stack.admin_token,
                endpoint_url=stack.model_endpoint,
                arm=spec.arm,
                script=spec.script,
                thread_id=thread_id,
                transcript_path=self.paths.transcript(spec.item_id, run_id, state.attempt),
                snapshots=self._snapshots,
                redactor=self.redactor,
                progress=progress,
                transcript_header=header,
            )
        except asyncio.CancelledError:
            return self._with_death(progress.interrupted_result())
        if result.verdict is Verdict.INFRA_ERROR and self._watch is not None:
            # A dead service explains the failure better than the symptom the driver saw.
            death = self._watch.check()
            if death is None and result.error is not None and result.error.kind == "backend_model":
                death = await self._model_server_death()
            if death is not None:
                return self._with_death(result)
        self._observe(result)
        return result

    async def _model_server_death(self) -> ServiceDeath | None:
        """After a model error: is the model server gone? A vLLM whose engine died answers
        one 5xx, then exits (with status 0) a moment later; so unless its /health answers,
        give its process a few seconds to end."""
        stack, watch, client = self.stack, self._watch, self._client
        if stack is None or stack.llm is None or watch is None or client is None:
            return None
        try:
            response = await client.get(f"{stack.llm_url}/health", timeout=2.0)
            if response.status_code == 200:
                return None
        except httpx.HTTPError:
            pass
        deadline = time.monotonic() + MODEL_EXIT_GRACE_S
        try:
            while time.monotonic() < deadline:
                death = watch.check()
                if death is not None:
                    return death
                await asyncio.sleep(0.1)
        except asyncio.CancelledError:
            # The watch found the death first and cancelled what was in flight: that death
            # is this conversation's answer.
            if watch.death is None:
                raise
            return watch.death
        return None

    def _with_death(self, result: ConversationResult) -> ConversationResult:
        """The result of a conversation a dead service ended: infra_error, naming it."""
        death = self._watch.death if self._watch is not None else None
        if death is None:
            return result
        verdict = resolve_verdict([result.verdict, Verdict.INFRA_ERROR])
        if verdict is not Verdict.INFRA_ERROR:
            return result  # a substitution found earlier still outranks it
        message = self.redactor.redact(death.describe())
        error = ErrorInfo(kind="service_died", message=message)
        return dataclasses.replace(result, verdict=verdict, error=error)

    def _on_death(self, death: ServiceDeath) -> None:
        """Stop at once: nothing more is admitted, what is in flight ends as infra_error."""
        reason = self.redactor.redact(death.describe())
        self._require_runner().cancel_in_flight(reason)
        self.on_stop(reason)

    def _observe(self, result: ConversationResult) -> None:
        """Feed the breaker while the conversation still holds its slot, so that no
        conversation is admitted between the failure that trips it and the stop."""
        infra = result.verdict in (Verdict.INFRA_ERROR, Verdict.RATE_LIMITED)
        service = _failing_service(result.error) if infra else None
        was_tripped = self.breaker.tripped
        if self.breaker.observe(infra, service=service) and not was_tripped:
            reason = f"circuit breaker: {self.breaker.reason()}"
            self._require_runner().stop_admitting(reason)
            culprit = service or "backend"
            self.on_stop(f"{reason}; the tail of the {culprit} log:\n{self.log_tail(culprit)}")

    # -- on the runner's finish threads -------------------------------------------------

    def _finish(
        self, state: ItemAttempt, outcome: ConversationResult | BaseException, in_flight: int
    ) -> Conversation:
        result = outcome if isinstance(outcome, ConversationResult) else self._failed(outcome)
        state.started_at = result.started_at
        try:
            record = self.recorder.record(
                state,
                result.verdict,
                turns=result.turns,
                error=result.error,
                finished_at=result.finished_at,
                in_flight_at_start=in_flight,
            )
        except LedgerWriteError as exc:
            # Results that cannot be kept are not worth running: stop as a tripped breaker
            # does (exit 75), blaming the file system. The item's wait() raises it.
            self._require_runner().stop_admitting(str(exc))
            self.on_stop(str(exc))
            raise
        self.admission.observe(state.spec.stratum, result.verdict, result.duration_s)
        transcript = self.paths.transcript(state.spec.item_id, self.claim.run_id, state.attempt)
        return Conversation(spec=state.spec, result=result, record=record, transcript=transcript)

    def _failed(self, exc: BaseException) -> ConversationResult:
        now = datetime.now(UTC)
        kind = "interrupted" if isinstance(exc, asyncio.CancelledError) else "harness"
        verdict = Verdict.INTERRUPTED if kind == "interrupted" else Verdict.INFRA_ERROR
        message = self.redactor.redact(f"{type(exc).__name__}: {exc}")
        return ConversationResult(
            verdict=verdict,
            turns=(),
            error=ErrorInfo(kind=kind, message=message),
            started_at=now,
            finished_at=now,
            duration_s=0.0,
        )

    def _require_runner(self) -> Runner[ItemAttempt, ConversationResult, Conversation]:
        if self._runner is None:
            raise StackError(f"the conversations of arm {self.arm.name} are not running")
        return self._runner

    def _require_stack(self) -> Stack | AttachedStack:
        if self.stack is None:
            raise StackError(f"the stack of arm {self.arm.name} is not running")
        return self.stack


def _view(arm: str, stack: Stack | AttachedStack) -> HaicoStack:
    return HaicoStack(
        arm=arm,
        backend_url=stack.backend_url,
        llm_url=stack.llm_url,
        model_endpoint=stack.model_endpoint,
        log_paths=dict(stack.log_paths),
        ports=dict(stack.ports),
        timings=dict(stack.timings),
        readonly_dsn=stack.readonly_dsn,
        admin_token=stack.admin_token,
    )


def _failing_service(error: ErrorInfo | None) -> str:
    """Which service an infra failure points at, for the breaker's message."""
    kind = error.kind if error is not None else ""
    if kind in ("backend_model", "backend_auth"):
        return "llm"
    if kind == "snapshot":
        return "postgres"
    return "backend"
