"""The arm sessions of one pytest session: each started at its arm's first use (its static
gates first), stopped after its arm's last item, and all stopped at the end whatever
happened; the ways to end them early are `early` (`EarlyStops`)."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping, Sequence
from functools import cached_property, partial
from typing import TYPE_CHECKING, Any

import pytest

from pytest_haico.errors import NotAdmittedError, StackError, headline
from pytest_haico.gates.result import GateFailedError, first_failure
from pytest_haico.gates.static import WALLTIME
from pytest_haico.ledger.recorder import ATTEMPT_KEY, ItemAttempt, Recorder
from pytest_haico.runner.breaker import CircuitBreaker
from pytest_haico.runner.early_stops import EarlyStops
from pytest_haico.runner.observer import ArmRunsObserver, ObservedRecorder
from pytest_haico.runner.skips import is_skipped_by_marks
from pytest_haico.runner.stopping import StopCause, StopKind, Stops, interrupted_start_line

if TYPE_CHECKING:
    from pytest_haico.config.experiment import Arm
    from pytest_haico.config.items import ItemSpec
    from pytest_haico.config.settings import Settings
    from pytest_haico.runner.arm_request import RunRecorder
    from pytest_haico.runner.arm_run import ArmRun, HaicoStack
    from pytest_haico.runner.finished import Conversation
    from pytest_haico.runner.judges import TurnJudge
    from pytest_haico.runner.preflight import ArmPreflights, GateLog
    from pytest_haico.stack.kept import KeptState

_log = logging.getLogger(__name__)


class ArmRuns:
    """Starts each arm's stack once, keeps its conversations in flight, stops it once."""

    def __init__(
        self,
        settings: Settings,
        arms: dict[str, Arm],
        recorder: Recorder,
        *,
        kept: KeptState | None = None,
        judges: Mapping[str, TurnJudge] | None = None,
    ) -> None:
        self.settings = settings
        self.judges = dict(judges or {})  # per arm: what scores its turns' judge expectations
        self.kept = kept  # --haico-attach: the kept stack every arm run uses
        self.arms = arms
        self.recorder = recorder
        # Why the runs stopped short, if they did: the first arm start that failed (exit
        # 78), a breaker, a dead service, a drain, the walltime, SIGTERM (exit 75).
        self.stops = Stops()
        self._sessions: dict[str, ArmRun] = {}
        self.early = EarlyStops(self.stops, self._sessions)  # drains, SIGTERM, SIGINT
        # A signal that came while a stack was starting: raised once the start has ended.
        self.start_interrupt: KeyboardInterrupt | None = None
        self._launching = False  # an arm's gates and stack are starting on the main thread
        self._starting: ArmRun | None = None  # its run, once it has one
        self.tearing_down = False
        self._session: pytest.Session | None = None
        self._failures: dict[str, str] = {}
        self._attempts: dict[str, list[ItemAttempt]] = {}
        self._gated: dict[str, list[ItemSpec]] = {}  # --haico-gates-only: the arm's items
        self._last_nodeid: dict[str, str] = {}
        self.observer: ArmRunsObserver | None = None

    def plan(self, session: pytest.Session, items: Sequence[pytest.Item]) -> None:
        """Remember, per arm, which attempts to keep in flight and where the arm's items end.

        Only items that will run are queued: one that a mark skips has no conversation.
        """
        self._session = session
        for item in items:
            state = item.stash.get(ATTEMPT_KEY, None)
            if state is None:
                continue
            arm = state.spec.arm.name
            self._last_nodeid[arm] = item.nodeid
            converses = "haico_conversation" in getattr(item, "fixturenames", ())
            if converses and not is_skipped_by_marks(item):
                self._attempts.setdefault(arm, []).append(state)

    def stack(self, arm: str) -> HaicoStack:
        """The arm's running stack, started (and its conversations queued) on first use.

        An arm whose stack failed to start is not started again: each later use fails at
        once with the same `StackError`.
        """
        failure = self._failures.get(arm)
        if failure is not None:
            raise StackError(failure)
        session = self._sessions.get(arm)
        stopping = self.stops.no_new_stack()
        if stopping is not None and (session is None or session.stopped):
            raise NotAdmittedError(stopping)
        # Stopped after the arm's last item, a later hand-written test starts it anew.
        if session is None or session.stopped:
            session = self._start(arm)
        assert session.view is not None
        return session.view

    def run_gates_only(self, arm: str, specs: Sequence[ItemSpec]) -> None:
        """--haico-gates-only: the arm's static gates, its stack, its dynamic gates, its
        stop; no conversation. `specs` are the arm's selected items (their scripts and
        strata are gated). A failure is the session's failed start, as in a run."""
        if self.stops.no_new_stack() is not None:
            return  # a drain or SIGTERM came between two arms: nothing new starts
        self._gated[arm] = list(specs)
        try:
            self._start(arm, gates_only=True)
        except StackError:
            return
        self._stop(arm, final_dump=False)

    @property
    def runs(self) -> Mapping[str, ArmRun]:
        """The arms started in this session, by name."""
        return self._sessions

    @property
    def gate_logs(self) -> Mapping[str, GateLog]:
        """Arm -> every gate its start ran, and gates.json (kept when a static gate failed)."""
        return self._static.gate_logs

    def failure(self, arm: str) -> str | None:
        """Why the arm's stack did not start or failed a gate, if it did."""
        return self._failures.get(arm)

    def conversation(self, state: ItemAttempt) -> Conversation:
        self.stack(state.spec.arm.name)
        return self._sessions[state.spec.arm.name].conversations.wait(state)

    def after(self, item: pytest.Item) -> None:
        """Stop the stack of the arm whose last item this was."""
        for arm, last in self._last_nodeid.items():
            if last == item.nodeid and arm in self._sessions:
                self._stop(arm)

    def elapsed_s(self, arm: str) -> float | None:
        """How long the arm's stack was up, stack start and stop included."""
        session = self._sessions.get(arm)
        return session.elapsed_s if session is not None else None

    def stop_all(self) -> None:
        """Stop every arm: at the session's end, or at once on an interrupt."""
        self.tearing_down = True
        for arm in self._sessions:
            try:
                self._stop(arm, final_dump=self.stops.get(StopKind.TERMINATED) is None)
            except Exception:  # one arm's cleanup must not keep the others running
                _log.exception("haico: stopping the stack of arm %s", arm)

    # -- a signal during a start: called from signal handlers, so nothing here waits ----

    @property
    def starting(self) -> bool:
        """Whether an arm's gates and stack are starting on the main thread."""
        return self._launching

    def interrupt_start(self, error: KeyboardInterrupt) -> None:
        """The stack starting now stops at its next step; `error` is then raised on the
        main thread, where the start was called (never into whatever it was doing)."""
        if self.start_interrupt is None:
            self.start_interrupt = error
        starting = self._starting
        if starting is not None:
            starting.interrupt_start(str(error) or type(error).__name__)

    def holds_conversation(self, state: ItemAttempt) -> bool:
        """Whether the item's work is a conversation of the runner: then the runner records
        it (with the turns it had) when it ends or is cancelled, or nothing if it never
        started; an interrupt of the item itself records nothing."""
        return state in self._attempts.get(state.spec.arm.name, ())

    def _start(self, arm: str, *, gates_only: bool = False) -> ArmRun:
        """The arm's static gates, then its run started (stack, dynamic gates, runner) and
        its conversations queued. A signal meanwhile is raised here, once the start ended."""
        self._launching = True
        session: ArmRun | None = None
        began = time.monotonic()
        self._tell("stack_starting", arm)
        try:
            session = self._launch(arm, gates_only=gates_only)
        except StackError as exc:
            # An interrupt cancels what the start was doing: that is no failure of the stack.
            if self.start_interrupt is None:
                told = exc.brief
                self._tell("stack_started", arm, seconds=time.monotonic() - began, error=told)
                raise StackError(self._fail(arm, exc)) from None
            session = self._sessions.get(arm)
        else:
            self._tell("stack_started", arm, seconds=time.monotonic() - began, error=None)
        finally:
            self._launching = False
            self._starting = None
        interrupt, self.start_interrupt = self.start_interrupt, None
        if interrupt is not None:
            if session is not None:
                self._stop(arm, final_dump=False)  # idempotent: a start that raised stopped all
            seconds = time.monotonic() - began
            self._tell("stack_interrupted", arm, seconds=seconds)
            # pytest shows an `Interrupted` as its one "!" line (a bare KeyboardInterrupt gets
            # the line it was raised on, and a hint about --full-trace).
            raise pytest.Session.Interrupted(
                interrupted_start_line(arm, interrupt, seconds=seconds)
            ) from interrupt
        assert session is not None
        if not gates_only:
            for state in self._attempts.get(arm, []):
                if state.recorded is None:
                    session.conversations.submit(state)
        return session

    def preflight(self) -> bool:
        """Every planned arm's static gates, before anything starts: False, and the first
        failure is the session's failed start (exit 78), when one failed."""
        for arm in sorted(self._attempts):
            try:
                self._static.run(arm, self._specs(arm))
            except GateFailedError as exc:
                self._fail(arm, exc)
                return False
        return True

    @cached_property
    def _static(self) -> ArmPreflights:
        """Each arm's static gates, run once (a passed run is kept for its start)."""
        from pytest_haico.runner.preflight import ArmPreflights

        judge_gates = {arm: judge.gate for arm, judge in self.judges.items()}
        return ArmPreflights(self.settings, self.arms, self.recorder, judge_gates=judge_gates)

    def _specs(self, arm: str) -> list[ItemSpec]:
        """The items the arm's gates are over: those of this run (or, under
        --haico-gates-only, those it would run)."""
        return self._gated.get(arm) or [state.spec for state in self._attempts.get(arm, [])]

    def _launch(self, arm: str, *, gates_only: bool) -> ArmRun:
        settings = self.settings
        admission, gate_log = self._static.run(arm, self._specs(arm))
        # Imported only now, so that a failed static gate does not pay it (~0.3 s: the stack,
        # the driver, httpx, psycopg).
        from pytest_haico.runner.arm_request import ArmRunRequest, stack_source
        from pytest_haico.runner.arm_run import ArmRun

        recorder: RunRecorder = self.recorder
        served = self._static.served.get(arm)  # resolved by its gate served_model
        if self.observer is not None:
            recorder = ObservedRecorder(self.recorder, self.observer)
        request = ArmRunRequest(
            arm=self.arms[arm],
            stack=stack_source(
                settings, self.arms[arm], self.recorder, kept=self.kept, served=served
            ),
            concurrency=settings.concurrency,
            dump_interval_s=settings.dump_interval,
            gates_only=gates_only,
            recorder=recorder,
            breaker=CircuitBreaker(),
            admission=admission,
            gate_log=gate_log,
            provenance=partial(self._provenance, arm),
            on_stop=self.early.stopped,
            on_admission_stop=self.early.stop_admitting,
            judge=self.judges.get(arm),
        )
        session = ArmRun(request)
        self._starting = session  # from now on a signal interrupts its start (StackLife)
        if self.start_interrupt is not None:  # it came during the gates or the imports
            raise StackError("interrupted before the stack started")
        self._sessions[arm] = session
        session.start()
        return session

    def _stop(self, arm: str, *, final_dump: bool = True) -> None:
        """Stop the arm's run (once: a stopped run's stop does nothing), and tell so."""
        session = self._sessions[arm]
        if session.stopped:
            return
        try:
            session.stop(final_dump=final_dump)
        finally:
            self._tell("stack_stopped", arm, seconds=session.elapsed_s)

    def _tell(self, event: str, arm: str, **details: Any) -> None:
        """Tell the observer, if any; its failure is logged, never raised into the run."""
        if self.observer is None:
            return
        try:
            getattr(self.observer, event)(arm, **details)
        except Exception:
            _log.exception("haico: the arm runs' observer failed on %s", event)

    def _fail(self, arm: str, error: StackError) -> str:
        """Record why the arm cannot run (a gate, its stack); the first is the session's, in
        full. What the arm's items and pytest's stop line say is returned: for a gate, which."""
        gate = first_failure(error.results) if isinstance(error, GateFailedError) else None
        what = f"arm {arm}" if gate else f"the stack of arm {arm} did not start"
        failure, told = f"{what}: {error}", f"{what}: {error.brief}"
        self._failures[arm] = told
        if gate is None:
            kind = StopKind.STACK_FAILED
        else:
            kind = StopKind.SHORT_OF_TIME if gate.name == WALLTIME else StopKind.GATE_FAILED
        self.stops.add(StopCause(kind, failure))
        if self._session is not None:  # pytest stops after the current item
            self._session.shouldstop = f"haico: {headline(told)}"
        return told

    def _provenance(self, arm: str) -> dict[str, str]:
        """What run-config records of this arm before its stack starts."""
        from pytest_haico.provenance.runconfig import arm_values

        planned = self._attempts.get(arm)
        spec = planned[0].spec if planned else None
        values = arm_values(self.settings, self.arms[arm], self.recorder.job, spec, os.environ)
        served = self._static.served.get(arm)
        return {**values, **(served.provenance() if served is not None else {})}

    def served_model(self, arm: str) -> str | None:
        """The served model (`haico serve`) that answers the arm's run, in the summary's words."""
        served = self._static.served.get(arm) if arm in self._sessions else None
        return served.describe() if served is not None and served.served is not None else None


ARM_RUNS_KEY = pytest.StashKey[ArmRuns]()
