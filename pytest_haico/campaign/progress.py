"""The job log: when the output is not a terminal (a batch job's log file), one flushed line
per finished item, as its record reaches the disk, with the count, the conversations in
flight and an ETA from the measured rate, and a line when an arm's stack is healthy and
when it stops; pytest's dots are left out. On a terminal, with -q or -v, pytest's own."""

from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
import threading
import time
from collections.abc import Generator, Sequence
from typing import TextIO

import pytest

from pytest_haico.config.settings import ProgressMode, Settings
from pytest_haico.durations import format_duration
from pytest_haico.errors import headline
from pytest_haico.ledger.recorder import ATTEMPT_KEY, ItemAttempt, Recorder
from pytest_haico.ledger.records import LedgerRecord
from pytest_haico.runner.arm_runs import ArmRuns
from pytest_haico.runner.skips import is_skipped_by_marks

_log = logging.getLogger(__name__)


def shows_lines(config: pytest.Config, mode: ProgressMode) -> bool:
    """Whether this session writes the job log's lines instead of pytest's dots."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if mode is ProgressMode.OFF or not isinstance(reporter, pytest.TerminalReporter):
        return False
    if config.option.collectonly or config.get_verbosity() < 0:
        return False  # -q: nothing extra
    if config.get_verbosity(pytest.Config.VERBOSITY_TEST_CASES) > 0:
        return False  # -v: pytest's own line per test, which ours would interleave with
    return mode is ProgressMode.LINES or not reporter.isatty()


class JobLog:
    """Whole lines to the session's output, from any thread, each in one write.

    pytest's capture points file descriptor 1 at a temporary file while an item runs, and
    conversations end while items run: a duplicate of the descriptor, taken at configure
    time (capture is suspended then), still points at the job's log.
    """

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._encoding = getattr(stream, "encoding", None) or "utf-8"
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._broken = False
        try:
            self._fd = os.dup(stream.fileno())
        except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
            self._fd = None  # an in-memory stream (pytester's), which capture leaves alone

    def line(self, text: str) -> None:
        with self._lock:
            if self._broken:
                return
            try:
                if self._fd is None:
                    self._stream.write(text + "\n")
                    self._stream.flush()
                    return
                data = (text + "\n").encode(self._encoding, "replace")
                while data:
                    data = data[os.write(self._fd, data) :]
            except (OSError, ValueError) as exc:
                self._broken = True  # a closed pipe: the run goes on without its log
                _log.warning("haico: the job log cannot be written: %s", exc)

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
            self._broken = True


class ProgressPlugin:
    """The job log's lines (registered as "haico-progress" only when they are shown); it is
    the arm runs' observer, so a conversation's line comes the moment its record is on disk,
    from the runner's thread, not when pytest reports the item."""

    def __init__(
        self, config: pytest.Config, sessions: ArmRuns, recorder: Recorder, log: JobLog
    ) -> None:
        self.config = config
        self.sessions = sessions
        self.recorder = recorder
        self.log = log
        self.running = False  # pytest's run loop: its per-test output is left out meanwhile
        self._lock = threading.Lock()
        self.total = 0
        self.done = 0
        self._told: set[str] = set()  # nodeids whose record had its line
        self._attempts: dict[str, ItemAttempt] = {}  # the session's haico items by nodeid
        self._arms_left: set[str] = set()  # arms whose stack has not started yet
        self._began: float | None = None
        self._paused_at: float | None = None  # a stack is starting: not conversation time
        self._paused_s = 0.0
        self._startups: list[float] = []
        self._up: set[str] = set()  # arms whose stack is healthy and not stopped yet

    @classmethod
    def install(
        cls, config: pytest.Config, settings: Settings, sessions: ArmRuns, recorder: Recorder
    ) -> ProgressPlugin | None:
        """Register the plugin when this session shows the job log's lines."""
        if not shows_lines(config, settings.progress):
            return None
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        assert isinstance(reporter, pytest.TerminalReporter)
        reporter.showfspath = False  # its file names start lines ours would continue
        plugin = cls(config, sessions, recorder, JobLog(sys.stdout))
        sessions.observer = plugin
        config.pluginmanager.register(plugin, "haico-progress")
        return plugin

    # -- pytest's side --------------------------------------------------------------------

    @pytest.hookimpl(wrapper=True)
    def pytest_runtestloop(self, session: pytest.Session) -> Generator[None, object, object]:
        attempts = _to_run(session.items)
        self._attempts = {
            item.nodeid: state
            for item in session.items
            if (state := item.stash.get(ATTEMPT_KEY, None)) is not None
        }
        with self._lock:
            self.total = len(attempts)
            self._arms_left = {state.spec.arm.name for state in attempts}
            self._began = time.monotonic()
        self.running = True
        self._flush_pytest()
        try:
            return (yield)
        finally:
            self.running = False

    @pytest.hookimpl(wrapper=True)
    def pytest_report_teststatus(
        self, report: pytest.TestReport
    ) -> Generator[None, tuple[str, object, object], tuple[str, object, object]]:
        status = yield
        if self.running and isinstance(status, tuple) and len(status) == 3:
            # Nothing per test while the loop runs (a dot would start a line that a line of
            # ours, from another thread, continues); the summaries after it have the words.
            return status[0], "", ""
        return status

    def pytest_runtest_logstart(self) -> None:
        # Capture is off between items: pytest's buffered lines go out before any of ours.
        self._flush_pytest()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """A line for a test whose record had none: a hand-written test, an item that did
        not start, an error in a teardown."""
        self._flush_pytest()
        if not self.running:
            return
        if report.when == "call":
            outcome = _word(report)
        elif report.failed or report.skipped:
            outcome = _word(report) if report.when == "setup" else f"{_word(report)} in teardown"
        else:
            return
        with self._lock:
            told = report.nodeid in self._told and report.when != "teardown"
        if told:
            return
        text = f"{self._label(report)} {outcome}"
        if report.skipped and isinstance(report.longrepr, tuple) and len(report.longrepr) == 3:
            text += f": {str(report.longrepr[2]).removeprefix('Skipped: ')}"
        elif report.when == "call":
            text += f" {format_duration(report.duration, 'log')}"
        self.log.line(text)

    def pytest_unconfigure(self) -> None:
        self.log.close()

    # -- the arm runs' side (ArmRunsObserver) ---------------------------------------------

    def stack_starting(self, arm: str) -> None:
        with self._lock:
            self._paused_at = time.monotonic()

    def stack_started(self, arm: str, *, seconds: float, error: str | None) -> None:
        with self._lock:
            self._resume()
            self._arms_left.discard(arm)
            if error is None:
                self._startups.append(seconds)
                self._up.add(arm)
        took = format_duration(seconds, "log")
        if error is not None:
            first = headline(error)
            rest = " (the haico summary has the rest)" if first != error else ""
            self.log.line(f"haico: {arm} stack failed after {took}: {first}{rest}")
            return
        if self.sessions.kept is not None:
            self.log.line(f"haico: {arm} attached to the kept stack, gates passed in {took}")
            return
        self.log.line(f"haico: {arm} stack healthy in {took}{self._ready(arm)}")

    def stack_interrupted(self, arm: str, *, seconds: float) -> None:
        # No line: the session ends at once, on pytest's line saying so.
        with self._lock:
            self._resume()
            self._arms_left.discard(arm)

    def stack_stopped(self, arm: str, *, seconds: float | None) -> None:
        with self._lock:
            if arm not in self._up:
                return  # it never was healthy: its failed start had the line
            self._up.discard(arm)
        count = sum(self.recorder.verdicts.get(arm, {}).values())
        after = f" after {format_duration(seconds, 'log')}" if seconds is not None else ""
        if self.sessions.kept is not None:
            self.log.line(
                f"haico: {arm} detached{after}, {count} item(s) recorded; the stack runs on"
            )
            return
        up = f"{after} up" if after else ""
        self.log.line(f"haico: {arm} stack stopped{up}, {count} item(s) recorded")

    def recorded(self, state: ItemAttempt, record: LedgerRecord) -> None:
        """A record is on disk (the runner's, or the report hook's): the item's line."""
        in_flight = sum(run.conversations.in_flight for run in list(self.sessions.runs.values()))
        with self._lock:
            self.done += 1
            self._told.add(state.nodeid)
            done, total, eta = self.done, max(self.total, self.done), self._eta()
        spec = state.spec
        width = len(str(total))
        # Once the run stops admitting (a drain, the walltime, a breaker, SIGTERM) what is
        # left will not run in this job: no time left to tell.
        runs = self.sessions
        stopping = runs.stops.stopped_short
        took = format_duration(record.duration_s, "log")
        left = "stopping" if stopping else f"ETA {format_duration(eta, 'log')}"
        self.log.line(
            f"[{done:>{width}}/{total}] {spec.arm.name} {spec.script.id}-r{spec.repeat} "
            f"{record.verdict.value} {took} · {in_flight} in flight · {left}"
        )

    # -- helpers ----------------------------------------------------------------------------

    def _eta(self) -> float:
        """Seconds left: the items left at the measured time per item (stack start-ups left
        out), plus a measured start-up for each arm not started yet. Under the lock."""
        if self._began is None or not self.done:
            return 0.0
        now = time.monotonic()
        paused = self._paused_s + (now - self._paused_at if self._paused_at is not None else 0)
        per_item = max(now - self._began - paused, 0.0) / self.done
        startup = sum(self._startups) / len(self._startups) if self._startups else 0.0
        return max(self.total - self.done, 0) * per_item + len(self._arms_left) * startup

    def _resume(self) -> None:
        if self._paused_at is not None:
            self._paused_s += time.monotonic() - self._paused_at
            self._paused_at = None

    def _ready(self, arm: str) -> str:
        """When each service was healthy, from the stack's start: where the start-up went."""
        run = self.sessions.runs.get(arm)
        timings = run.view.timings if run is not None and run.view is not None else {}
        if not timings:
            return ""
        order = sorted(timings.items(), key=lambda pair: pair[1].ready)
        ready = (f"{name} {format_duration(t.ready, 'log')}" for name, t in order)
        return f" (ready: {', '.join(ready)})"

    def _label(self, report: pytest.TestReport) -> str:
        state = self._attempts.get(report.nodeid)
        if state is None:
            return report.nodeid
        return f"{state.spec.arm.name} {state.spec.script.id}-r{state.spec.repeat}"

    def _flush_pytest(self) -> None:
        with contextlib.suppress(OSError, ValueError):  # a closed output: nothing to flush
            self.config.get_terminal_writer().flush()


def _to_run(items: Sequence[pytest.Item]) -> list[ItemAttempt]:
    """The haico items this run records: those not yet recorded that no mark skips."""
    return [
        state
        for item in items
        if (state := item.stash.get(ATTEMPT_KEY, None)) is not None
        and state.recorded is None
        and not is_skipped_by_marks(item)
    ]


def _word(report: pytest.TestReport) -> str:
    if hasattr(report, "wasxfail"):
        return "xpassed" if report.passed else "xfailed"
    if report.failed and report.when != "call":
        return "error"
    return report.outcome
