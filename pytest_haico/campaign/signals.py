"""The campaign's signal handlers: INT (stop now), USR1 (drain) and TERM (Slurm's emergency).

A batch wrapper starts pytest in the background of a non-interactive shell, which hands it
SIGINT ignored, and Python keeps an inherited SIG_IGN; Python's default for SIGTERM and
SIGUSR1 is to die without finalizers. So all three handlers are installed whatever the
process inherited, from configure on in a run that collects the experiments directory (at
the end of collection in one that collects a campaign's tests from elsewhere; never in one
that collects none), and the previous ones are restored at unconfigure (an in-process
pytester run leaves none behind). Until configure the plugin holds them (`early_signals`);
a campaign acts on a held one as it installs its handlers. Until the session starts
collecting, what a handler would raise is held too, and raised as collection begins: the
session then ends the campaign's way (its summary, its exit code), never at configure.

* INT: every in-flight item is recorded `interrupted` at once; campaign mode exits 75. A
  second INT while the session stops only cancels what is still in flight: the stack is
  still stopped and cleaned, and the exit code is the first INT's.
* USR1: nothing new starts; in-flight conversations get --haico-drain-timeout, then are
  cancelled and recorded `interrupted`; the final dump runs; exit 75 in both modes. A
  second USR1 ends the drain at once; a USR1 while a stack starts stops it at once.
* TERM: every in-flight item is recorded `interrupted` at once, a running dump is killed,
  no final dump; exit 75 in both modes.

A signal during teardown never interrupts it (the stack must still stop and the records
be written): INT and TERM then only cancel what is still in flight. A handler that would
raise while the main thread writes a record raises right after the write instead; one that
would raise while a stack starts makes the start end at its next step (within a poll
interval; a gate under way is cancelled), and the start raises it.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import threading
from collections.abc import Iterator
from types import FrameType

import pytest

from pytest_haico.campaign.early_signals import EarlySignals, Handler
from pytest_haico.runner.arm_runs import ArmRuns


class TerminatedError(KeyboardInterrupt):
    """SIGTERM: the walltime, `scancel` or a preemption; SIGKILL follows after KillWait."""


class DrainedAtStartError(KeyboardInterrupt):
    """SIGUSR1 while a stack was starting: the services stop and the run ends at once."""


class SessionSignals:
    """Installs the session's INT, USR1 and TERM handlers and restores what they replaced."""

    def __init__(self, sessions: ArmRuns, *, drain_timeout_s: float) -> None:
        self.sessions = sessions
        self.drain_timeout_s = drain_timeout_s
        self.terminated = False
        self.interrupted = False
        self._previous: dict[signal.Signals, Handler] = {}
        self._started = False  # whether the session has begun collecting
        self._deferring = False
        self._pending: KeyboardInterrupt | None = None
        self._stderr: int | None = None  # the process's own stderr, not pytest's capture

    def install(self, early: EarlySignals | None = None) -> None:
        """The handlers, in place of those `early` held the signals with (then the signals it
        held are acted on, in their order)."""
        if threading.current_thread() is not threading.main_thread():
            return
        # At configure time fd 2 is still the process's stderr (a terminal, a job's log);
        # during a test pytest's capture replaces it, so the handlers keep their own copy.
        with contextlib.suppress(OSError):
            self._stderr = os.dup(2)
        handlers = {
            signal.SIGINT: self._int,
            signal.SIGUSR1: self._usr1,
            signal.SIGTERM: self._term,
        }
        held = early.take_over() if early is not None else {}
        for signum, handler in handlers.items():
            previous = signal.signal(signum, handler)
            self._previous[signum] = held.get(signum, previous)
        for signum in early.pending if early is not None else ():
            handlers[signum](signum, None)

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection(self) -> None:
        """The session has started: an interrupt held since configure is raised now."""
        self._started = True
        pending, self._pending = self._pending, None
        if pending is not None:
            raise pending

    @pytest.hookimpl(tryfirst=True)
    def pytest_keyboard_interrupt(self, excinfo: pytest.ExceptionInfo[BaseException]) -> None:
        """Before pytest's terminal reporter renders the interrupt: a signal can land on an
        instruction without a line number (a generator's first, in Python 3.11), and
        pytest's rendering of that traceback entry fails (`tb_lineno` None), which would end
        the run with exit 1 instead of its exit code and summary.

        A SIGTERM's traceback is cut to where it landed: pytest renders every entry with
        its source and arguments (half a second on an idle node), and SIGKILL follows
        after KillWait; only that last entry is ever printed without --fulltrace."""
        drop_lineless_entries(excinfo.value)
        # A SIGTERM during a stack's start ends the session as an `Interrupted` caused by it.
        if isinstance(excinfo.value, TerminatedError) or isinstance(
            excinfo.value.__cause__, TerminatedError
        ):
            keep_crash_entry(excinfo.value)

    def pytest_unconfigure(self) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
        self._previous.clear()
        if self._stderr is not None:
            os.close(self._stderr)
            self._stderr = None

    @contextlib.contextmanager
    def deferred(self) -> Iterator[None]:
        """Hold back an interrupt the handlers would raise until the block has run, so that
        a record being written is either on disk whole or not written at all."""
        self._deferring = True
        try:
            yield
        finally:
            self._deferring = False
            pending, self._pending = self._pending, None
        if pending is not None:
            raise pending

    def _say(self, line: str) -> None:
        """One line on the process's stderr, from a signal handler: a plain write(2), so it
        neither waits for nor disturbs a write to sys.stderr that the handler interrupted."""
        if self._stderr is not None:
            with contextlib.suppress(OSError):
                # On a line of its own, whatever pytest's progress line was at.
                os.write(self._stderr, f"\nhaico: {line}\n".encode())

    def _interrupt(self, error: KeyboardInterrupt) -> None:
        if self._deferring or not self._started:
            self._pending = self._pending or error
            return
        if self.sessions.starting:
            # Raised into a Popen or a lock, it could leave a service behind: the start
            # ends at its next step instead, and raises it there.
            self.sessions.interrupt_start(error)
            return
        raise error

    def _int(self, signum: int, frame: FrameType | None) -> None:
        if self.sessions.tearing_down or self.interrupted:
            # The session is stopping already: a second Ctrl-C (pressed while pytest reports
            # the first) hurries it, never raises into that report or the stack's stop.
            if self.interrupted and not self.sessions.tearing_down:
                self._say("SIGINT again: stopping now; the stack still stops and is cleaned")
            self.sessions.early.cancel_in_flight("SIGINT: stopped by the user")
            return
        self.interrupted = True
        self._interrupt(KeyboardInterrupt())

    def _usr1(self, signum: int, frame: FrameType | None) -> None:
        if self.sessions.tearing_down and self.sessions.stops.drain is None:
            return  # every item ran: the run is finishing anyway
        again = self.sessions.stops.drain is not None
        self.sessions.early.begin_drain("SIGUSR1: draining", self.drain_timeout_s)
        drain = self.sessions.stops.drain
        if again:
            self._say(
                "SIGUSR1 again: the drain ends now; what is in flight is recorded interrupted"
            )
        elif drain is not None:
            self._say(
                f"SIGUSR1: draining: nothing new starts; {drain.in_flight} conversation(s) in "
                f"flight get --haico-drain-timeout {drain.timeout_s:g} s (a second SIGUSR1 "
                "ends the drain at once)"
            )
        if self.sessions.starting:
            self._interrupt(DrainedAtStartError("SIGUSR1"))

    def _term(self, signum: int, frame: FrameType | None) -> None:
        first = not self.terminated
        self.terminated = True
        reason = "SIGTERM: the job is being ended (walltime, scancel, preemption)"
        if first:
            self._say(f"{reason}: what is in flight is recorded interrupted now; no final dump")
        self.sessions.early.terminate(reason)
        if first and not self.sessions.tearing_down and not self.interrupted:
            self._interrupt(TerminatedError(reason))  # after a Ctrl-C the session is ending


def keep_crash_entry(error: BaseException) -> None:
    """Unlink the traceback entries of `error` between its head (whoever holds it sees the
    rest) and the innermost one that pytest does not hide, which pytest reports as where
    the exception was raised."""
    head = error.__traceback__
    if head is None:
        return
    crash, entry = head, head.tb_next
    while entry is not None:
        frame = entry.tb_frame
        if not (
            frame.f_locals.get("__tracebackhide__") or frame.f_globals.get("__tracebackhide__")
        ):
            crash = entry
        entry = entry.tb_next
    if crash is not head:
        head.tb_next = crash
    crash.tb_next = None


def drop_lineless_entries(error: BaseException) -> None:
    """Unlink the traceback entries without a line number from `error` and the exceptions
    it chains to; the outermost entry stays the head, so whoever holds it sees the rest."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        kept = []
        entry = current.__traceback__
        while entry is not None:
            if entry.tb_lineno is not None or entry is current.__traceback__:
                kept.append(entry)
            entry = entry.tb_next
        for outer, inner in itertools.pairwise(kept):
            outer.tb_next = inner
        if kept:
            kept[-1].tb_next = None
        current = current.__cause__ or current.__context__
