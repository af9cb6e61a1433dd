"""The arm sessions of one pytest session: each started at its arm's first use, stopped after
its arm's last item, and all stopped at the end whatever happened."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

import pytest

from pytest_haico.errors import GateError, StackError
from pytest_haico.ledger.recorder import ATTEMPT_KEY, ItemAttempt, Recorder
from pytest_haico.runner.breaker import CircuitBreaker

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
        self.gate_failure: str | None = None
        self.trip_reason: str | None = None
        self._session: pytest.Session | None = None
        self._sessions: dict[str, ArmRun] = {}
        self._attempts: dict[str, list[ItemAttempt]] = {}
        self._last_nodeid: dict[str, str] = {}

    def plan(self, session: pytest.Session, items: Sequence[pytest.Item]) -> None:
        """Remember, per arm, which attempts to keep in flight and where the arm's items end."""
        self._session = session
        for item in items:
            state = item.stash.get(ATTEMPT_KEY, None)
            if state is None:
                continue
            arm = state.spec.arm.name
            self._last_nodeid[arm] = item.nodeid
            if "haico_conversation" in getattr(item, "fixturenames", ()):
                self._attempts.setdefault(arm, []).append(state)

    def stack(self, arm: str) -> HaicoStack:
        """The arm's running stack, started (and its conversations queued) on first use."""
        session = self._sessions.get(arm)
        # Stopped after the arm's last item, a later hand-written test starts it anew.
        if session is None or session.stopped:
            if self.gate_failure is not None:
                raise GateError(self.gate_failure)
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
            drain_timeout=settings.drain_timeout,
            recorder=self.recorder,
            # Per arm: each arm has its own stack, and a bad stack is what the breaker detects.
            breaker=CircuitBreaker(),
            on_trip=self._trip,
        )
        self._sessions[arm] = session
        try:
            session.start()
        except StackError as exc:
            self.gate_failure = f"the stack of arm {arm} did not start: {exc}"
            if self._session is not None:
                self._session.shouldstop = f"haico: {self.gate_failure}"
            raise GateError(self.gate_failure) from None
        for state in self._attempts.get(arm, []):
            if state.recorded is None:
                session.submit(state)
        return session

    def _trip(self, reason: str) -> None:
        self.trip_reason = reason
        if self._session is not None:
            self._session.shouldstop = f"haico: {reason}"


ARM_RUNS_KEY = pytest.StashKey[ArmRuns]()
