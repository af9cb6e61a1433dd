"""The arm sessions of one pytest session: each started at its arm's first use, stopped after
its arm's last item, and all stopped at the end whatever happened."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

import pytest

from pytest_haico.errors import StackError
from pytest_haico.ledger.recorder import ATTEMPT_KEY, ItemAttempt, Recorder
from pytest_haico.runner.breaker import CircuitBreaker
from pytest_haico.runner.skips import is_skipped_by_marks

if TYPE_CHECKING:
    from pytest_haico.config.experiment import Arm
    from pytest_haico.config.settings import Settings
    from pytest_haico.runner.arm_run import ArmRun, Conversation, HaicoStack

_log = logging.getLogger(__name__)


class ArmRuns:
    """Starts each arm's stack once, keeps its conversations in flight, stops it once."""

    def __init__(self, settings: Settings, arms: dict[str, Arm], recorder: Recorder) -> None:
        self.settings = settings
        self.arms = arms
        self.recorder = recorder
        # The first arm whose stack did not start (exit 78), and why the run stopped early
        # otherwise: a tripped breaker, a service that died (exit 75).
        self.stack_failure: str | None = None
        self.stop_reason: str | None = None
        self._session: pytest.Session | None = None
        self._sessions: dict[str, ArmRun] = {}
        self._failures: dict[str, str] = {}
        self._attempts: dict[str, list[ItemAttempt]] = {}
        self._last_nodeid: dict[str, str] = {}

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
        # Stopped after the arm's last item, a later hand-written test starts it anew.
        if session is None or session.stopped:
            session = self._start(arm)
        assert session.view is not None
        return session.view

    def conversation(self, state: ItemAttempt) -> Conversation:
        self.stack(state.spec.arm.name)
        return self._sessions[state.spec.arm.name].wait(state)

    def after(self, item: pytest.Item) -> None:
        """Stop the stack of the arm whose last item this was."""
        for arm, last in self._last_nodeid.items():
            if last == item.nodeid and arm in self._sessions:
                self._sessions[arm].stop()

    def elapsed_s(self, arm: str) -> float | None:
        """How long the arm's stack was up, stack start and stop included."""
        session = self._sessions.get(arm)
        return session.elapsed_s if session is not None else None

    def stop_all(self) -> None:
        for arm, session in self._sessions.items():
            try:
                session.stop()
            except Exception:  # one arm's cleanup must not keep the others running
                _log.exception("haico: stopping the stack of arm %s", arm)

    def _start(self, arm: str) -> ArmRun:
        # Imported on first use: the stack and driver cost ~0.4 s to import.
        from pytest_haico.runner.arm_run import ArmRun

        settings = self.settings
        session = ArmRun(
            self.arms[arm],
            concurrency=settings.concurrency or self.arms[arm].run.concurrency,
            recorder=self.recorder,
            # Per arm: each arm has its own stack, and a bad stack is what the breaker detects.
            breaker=CircuitBreaker(),
            on_stop=self._stop_early,
        )
        self._sessions[arm] = session
        try:
            session.start()
        except StackError as exc:
            failure = f"the stack of arm {arm} did not start: {exc}"
            self._failures[arm] = failure
            if self.stack_failure is None:
                self.stack_failure = failure
            self._stop_session(failure)
            raise StackError(failure) from None
        for state in self._attempts.get(arm, []):
            if state.recorded is None:
                session.submit(state)
        return session

    def _stop_early(self, reason: str) -> None:
        """A breaker tripped or a service died: the session stops after the current item."""
        if self.stop_reason is None:
            self.stop_reason = reason
        self._stop_session(reason)

    def _stop_session(self, reason: str) -> None:
        if self._session is not None:
            self._session.shouldstop = f"haico: {_headline(reason)}"


def _headline(reason: str) -> str:
    """The reason without the log tail it ends on, for pytest's one-line "Interrupted: ...";
    the haico summary shows it whole."""
    first = reason.splitlines()[0] if reason else reason
    if first.endswith(":") and "; " in first:
        first = first.rsplit("; ", 1)[0]
    return first


ARM_RUNS_KEY = pytest.StashKey[ArmRuns]()
