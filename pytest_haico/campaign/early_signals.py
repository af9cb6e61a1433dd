"""The INT, USR1 and TERM that come before the campaign's own handlers.

From the plugin's registration (among pytest's entry points, before conftests, other
plugins' configure and the modules a campaign loads) until configure knows whether the
session runs a campaign, the three signals are held, not acted on: nothing has started
yet, and Python's default for TERM and USR1 is to die without finalizers. A campaign
ends at once if one came before its modules load (`end_campaign`: exit 75, one line), or else
takes them over (`SessionSignals.install`), which ends it as its collection begins, the
campaign's way (exit 75, its summary); any other session gets the handlers it had back,
and a held signal goes to them, as it would have without the plugin. A session that
ends at configure (a usage error) drops a held signal: it exits at once anyway.
Before pytest imports this module a signal does what the process inherited.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType

import pytest

Handler = Callable[[int, FrameType | None], object] | int | signal.Handlers | None
SIGNALS = (signal.SIGINT, signal.SIGUSR1, signal.SIGTERM)


class EarlySignals:
    """Holds the signals that come before configure decides, in the order they came."""

    def __init__(self) -> None:
        self.pending: list[signal.Signals] = []
        self._previous: dict[signal.Signals, Handler] = {}

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in SIGNALS:
            self._previous[signum] = signal.signal(signum, self._hold)

    def _hold(self, signum: int, frame: FrameType | None) -> None:
        held = signal.Signals(signum)
        if held not in self.pending:
            self.pending.append(held)

    def take_over(self) -> dict[signal.Signals, Handler]:
        """The handlers it replaced, for a campaign's own to restore at unconfigure; from now
        on it restores nothing."""
        previous, self._previous = self._previous, {}
        return previous

    def restore(self) -> None:
        """Put back the handlers it replaced (none once a campaign took over)."""
        for signum, handler in self.take_over().items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)

    def release(self) -> None:
        """Not a campaign: the handlers it replaced are back, and a held signal goes to them."""
        self.restore()
        pending, self.pending = self.pending, []
        for signum in pending:
            signal.raise_signal(signum)

    def end_campaign(self, config: pytest.Config, *, strict: bool) -> bool:
        """Whether a campaign whose session held a signal before anything started ends now,
        with the exit code the signal gives it later (INT in strict mode pytest's own 2, else
        75): nothing is started, in flight or to record, and the campaign's modules never
        load. Its session collects nothing and says so in one line (`EarlyEnd`)."""
        if not self.pending:
            return False
        from pytest_haico.campaign.summary import EXIT_RESUBMIT

        first = self.pending[0]
        interrupted = first is signal.SIGINT and strict
        code = pytest.ExitCode.INTERRUPTED if interrupted else EXIT_RESUBMIT
        line = (
            f"{first.name} before the campaign started (exit {code:d}): nothing ran, nothing "
            "was recorded"
        )
        config.pluginmanager.register(EarlyEnd(line, code), EARLY_END_PLUGIN)
        return True


EARLY_END_PLUGIN = "haico-early-end"


class EarlyEnd:
    """The session of a campaign ended before it started: it collects nothing, its haico
    summary is the one `line` (`pytest.exit` here would print it twice: pytest's `Exit:`
    and its interrupt banner), and it exits with `code`."""

    def __init__(self, line: str, code: int) -> None:
        self.line = line
        self.code = code

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection(self) -> bool:
        return True  # nothing to collect: the campaign never started

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        from pytest_haico.campaign.summary import write_stop_line

        write_stop_line(terminalreporter, self.line)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        session.exitstatus = self.code


EARLY_SIGNALS_KEY = pytest.StashKey[EarlySignals]()


def hold_signals(config: pytest.Config) -> None:
    """Hold INT, USR1 and TERM from now until configure decides (`EARLY_SIGNALS_KEY`);
    whatever way the session ends, the handlers they replaced are back at its cleanup."""
    early = EarlySignals()
    early.install()
    config.stash[EARLY_SIGNALS_KEY] = early
    config.add_cleanup(early.restore)


def take_held(config: pytest.Config) -> EarlySignals | None:
    """The session's held signals, now configure has decided (None if none were held)."""
    early = config.stash.get(EARLY_SIGNALS_KEY, None)
    if early is not None:
        del config.stash[EARLY_SIGNALS_KEY]
    return early
