"""One arm's live session: its stack, its provenance and dumps, and its conversations,
started once and stopped once."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from pytest_haico.errors import StackError
from pytest_haico.ledger.layout import ArmPaths
from pytest_haico.ledger.rundir import RunClaim
from pytest_haico.redact import Redactor
from pytest_haico.runner.arm_conversations import ArmConversations
from pytest_haico.runner.arm_provenance import ArmProvenance, Dumps
from pytest_haico.runner.arm_request import ArmRunRequest
from pytest_haico.runner.concurrency import ConcurrencyController
from pytest_haico.runner.outside import Outside
from pytest_haico.runner.run_timeline import RunTimeline
from pytest_haico.runner.stack_life import RunStack, StackLife
from pytest_haico.stack.orchestrator import ServiceTiming

T = TypeVar("T")


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
    """The arm's stack, its provenance and timeline, and its `conversations` (an item's
    conversation, and the ways to end them early, are theirs). `start` and `stop` run on
    pytest's main thread (services must be spawned there).
    """

    def __init__(self, request: ArmRunRequest, *, outside: Outside | None = None) -> None:
        self.request = request
        self.arm = request.arm
        self._outside = outside if outside is not None else Outside()
        self.claim: RunClaim = request.recorder.claim(self.arm.name)
        self.paths: ArmPaths = request.recorder.paths(self.arm.name)
        self.view: HaicoStack | None = None
        self.redactor = Redactor()
        self._life = StackLife(request.stack, open_stack=self._outside.open_stack)
        self._provenance = ArmProvenance(
            request,
            self.claim.path,
            open_dumps=self._outside.open_dumps,
            model_server_values=self._outside.model_server_values,
            model_server_metrics=self._outside.model_server_metrics,
        )
        controller = ConcurrencyController(
            request.in_flight, run_dir=self.claim.path, file_mode=request.recorder.file_mode
        )
        self.timeline = RunTimeline(request, self.claim, concurrency=controller.record)
        self.conversations = ArmConversations(
            request, controller=controller, timeline=self.timeline
        )
        self._stopped = False

    @property
    def stopped(self) -> bool:
        return self._stopped

    @property
    def stack(self) -> RunStack | None:
        return self._life.stack

    @property
    def elapsed_s(self) -> float | None:
        """Seconds from the start of the stack to its stop (or to now)."""
        return self._life.elapsed_s

    @property
    def dumps(self) -> Dumps | None:
        return self._provenance.dumps

    @property
    def dump_failure(self) -> str | None:
        """Why the final dump is missing, if it is."""
        return self._provenance.dump_failure

    @property
    def provenance_changes(self) -> list[str]:
        """What changed since the arm's previous run, one line each."""
        return self._provenance.provenance_changes

    def start(self) -> HaicoStack:
        """Start the stack (the static gates passed), run the dynamic gates, then start the
        dumps, the service watch and the conversations' runner; leak-proof (a failure stops
        what started). With `gates_only` it stops short after the dynamic gates: the caller
        then stops the stack, and no conversation runs.

        Every failure to start is a `StackError`, whatever raised it; a failed gate is its
        `GateFailedError`. The gate log's gates.json holds every gate run.
        """
        try:
            return self._start()
        except StackError:
            raise
        except Exception as exc:
            raise StackError(self.redactor.redact(f"{type(exc).__name__}: {exc}")) from exc

    def _start(self) -> HaicoStack:
        life, conversations, timeline = self._life, self.conversations, self.timeline
        # A run directory that takes no write (a full disk) ends the start before anything
        # starts, with one line; the services' logs are checked as they open.
        timeline.check_written()
        self.request.gate_log.check_written()
        stack = life.open()
        self.redactor = Redactor(stack.secrets)
        self.request.recorder.use_redactor(self.arm.name, self.redactor)
        timeline.start("stack")
        life.start()
        timeline.stack_started(stack)
        try:
            life.check_interrupted()
            channel = self._outside.open_channel(stack, self.request, self.redactor)
            conversations.start(
                channel,
                redactor=self.redactor,
                own_model_server=stack.llm is not None,
                log_tail=life.log_tail,
            )
            self._start_call(channel.open)
            timeline.start("dynamic_gates")
            gates = self._start_call(channel.dynamic_gates)
            timeline.end("dynamic_gates")
            self.request.gate_log.check(gates, redactor=self.redactor)
            self.request.gate_log.check_written()
            life.check_interrupted()
            view = _view(self.arm.name, stack)
            if self.request.gates_only:
                self.view = view
                return view
            self._provenance.start_dumps(stack)
            conversations.watch(lambda: stack.processes)
            self._provenance.record_start(stack, redactor=self.redactor)
            conversations.sample(stack)
            life.check_interrupted()
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
        self._life.interrupt(reason)
        self.conversations.cancel_calls()

    def _start_call(self, factory: Callable[[], Awaitable[T]]) -> T:
        """A step of the start on the runner's loop, which `interrupt_start` cancels."""
        self._life.check_interrupted()
        return self.conversations.call(factory)

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
        timeline, conversations = self.timeline, self.conversations
        try:
            timeline.draining(self.request.breaker.tripped)
            conversations.stop()
            timeline.end("drain")
            conversations.stop_sampling()
            self._provenance.detail("concurrency", conversations.concurrency)
            death = conversations.death
            postgres_died = death is not None and death.service == "postgres"
            timeline.start("final_dump")
            self._provenance.finish(final_dump=final_dump, postgres_died=postgres_died)
            timeline.end("final_dump")
        finally:
            timeline.start("stop")
            self._life.stop()
            timeline.end("stop")

    def abort_dumps(self) -> None:
        """No more pg_dumps; the one running is killed. Safe from a signal handler."""
        self._provenance.abort_dumps()


def _view(arm: str, stack: RunStack) -> HaicoStack:
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
