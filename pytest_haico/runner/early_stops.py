"""The session-wide ways to end the arm runs early — a drain (USR1), the walltime, SIGTERM,
SIGINT, and a stop a run asked for (a breaker, a dead service, a lost result) — each kept as
its `StopCause`, and what they leave of an item not started yet. Called from signal
handlers, so nothing here waits."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import pytest

from pytest_haico.errors import headline
from pytest_haico.ledger.recorder import ATTEMPT_KEY, ItemAttempt
from pytest_haico.runner.stopping import Drain, StopCause, StopKind, Stops

if TYPE_CHECKING:
    from pytest_haico.runner.arm_run import ArmRun


class EarlyStops:
    """Ends the session's arm `runs` (by arm name) early, recording why in `stops`."""

    def __init__(self, stops: Stops, runs: Mapping[str, ArmRun]) -> None:
        self.stops = stops
        self._runs = runs

    def begin_drain(self, reason: str, timeout_s: float) -> None:
        """Stop admitting everywhere; what is in flight gets `timeout_s`, then is cancelled.
        A second call ends the drain at once."""
        drain = self.stops.drain
        if drain is not None:
            drain.ended_early = True
            self.cancel_in_flight(f"{reason}: the drain was ended early")
            return
        runs = list(self._runs.values())
        in_flight = sum(run.conversations.in_flight for run in runs if not run.stopped)
        drain = Drain(timeout_s=timeout_s, in_flight=in_flight)
        self.stops.add(StopCause(StopKind.DRAINED, reason, drain=drain))
        # Each runner's own loop keeps the deadline: a signal handler must start no thread
        # (the interrupted code may hold the lock a new thread needs to start).
        for run in runs:
            run.conversations.cancel_after(timeout_s, reason)

    def terminate(self, reason: str) -> None:
        """The emergency path: cancel what is in flight, kill a running dump, no final dump."""
        self.stops.add(StopCause(StopKind.TERMINATED, reason))
        self.cancel_in_flight(reason)
        for run in list(self._runs.values()):
            run.abort_dumps()

    def cancel_in_flight(self, reason: str) -> None:
        """End every arm's conversations in flight now (recorded interrupted)."""
        for run in list(self._runs.values()):
            run.conversations.cancel_in_flight(reason)

    def stop_admitting(self, reason: str) -> None:
        """An arm's admission refused the next conversation for the walltime: every arm
        stops admitting, the in-flight ones finish, the run exits 75."""
        self.stops.add(StopCause(StopKind.NOT_ADMITTING, reason))
        for run in list(self._runs.values()):
            run.conversations.stop_admitting(reason)

    def stopped(self, reason: str) -> None:
        """A breaker, a dead service, a lost result: its arm admits no more (`stop_before`)."""
        self.stops.add(StopCause(StopKind.STOPPED, reason))

    def not_starting(self, state: ItemAttempt) -> str | None:
        """Why the item will not start (a drain, the walltime, SIGTERM), or None: an item
        whose conversation is already in flight (or done) goes on."""
        reason = self.stops.no_new_stack()
        if reason is None:
            return None
        run = self._runs.get(state.spec.arm.name)
        if run is not None and run.conversations.was_admitted(state):
            return None
        return reason

    def stop_before(self, session: pytest.Session, nextitem: pytest.Item | None) -> None:
        """After each item: once the run stopped early, stop before the next item unless it
        has a record or ends at once (it started before a breaker or a dead service)."""
        state = nextitem.stash.get(ATTEMPT_KEY, None) if nextitem is not None else None
        stopped = self.stops.reason(StopKind.STOPPED)
        if stopped is None or (state is not None and state.recorded is not None):
            return
        run = self._runs.get(state.spec.arm.name) if state is not None else None
        if state is None or run is None or not run.conversations.ends_at_once(state):
            session.shouldstop = f"haico: {headline(stopped)}"
