"""The campaign's signal handlers: INT (stop now) and TERM (Slurm's emergency path).

A batch wrapper starts pytest in the background of a non-interactive shell, which hands it
SIGINT ignored, and Python keeps an inherited SIG_IGN; Python's default for SIGTERM is to
die without finalizers. So both handlers are installed whatever the process inherited, for
the session only, and the previous ones are restored at unconfigure (an in-process pytester
run leaves none behind). Both end the session the way Ctrl-C does: every in-flight item is
recorded `interrupted` at once and campaign mode exits 75.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType

import pytest

_Handler = Callable[[int, FrameType | None], object] | int | signal.Handlers | None


class TerminatedError(KeyboardInterrupt):
    """SIGTERM: the walltime, `scancel` or a preemption; SIGKILL follows after KillWait."""


class SignalsPlugin:
    """Installs the session's INT and TERM handlers and restores what they replaced."""

    def __init__(self) -> None:
        self.terminated = False
        self._previous: dict[signal.Signals, _Handler] = {}

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        handlers: dict[signal.Signals, _Handler] = {
            signal.SIGINT: signal.default_int_handler,
            signal.SIGTERM: self._term,
        }
        for signum, handler in handlers.items():
            self._previous[signum] = signal.signal(signum, handler)

    def pytest_unconfigure(self) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
        self._previous.clear()

    def _term(self, signum: int, frame: FrameType | None) -> None:
        if self.terminated:
            return  # Slurm may send TERM again; the emergency path is already running
        self.terminated = True
        raise TerminatedError("SIGTERM: the job is being ended (walltime, scancel, preemption)")
