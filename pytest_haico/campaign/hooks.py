"""The campaign's pytest hooks: items parametrised, selected and grouped by arm, each run's
verdict recorded, the summary written and the exit code set."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Generator
from pathlib import Path

import pytest

from pytest_haico.campaign.checks import XDIST_MESSAGE
from pytest_haico.campaign.failures import compact_failure, with_verdict
from pytest_haico.campaign.job_exit import write_run_items
from pytest_haico.campaign.selection import Selection, Selector
from pytest_haico.campaign.signals import SessionSignals
from pytest_haico.campaign.summary import exit_status, write_summary
from pytest_haico.config.items import (
    ItemSpec,
    describe_k_beyond_arms,
    describe_missing_item_module,
    group_by_arm,
    has_item_module,
)
from pytest_haico.config.settings import Settings
from pytest_haico.errors import (
    InfraError,
    LedgerWriteError,
    RateLimitedError,
    ResultsError,
    StackError,
)
from pytest_haico.ledger.recorder import ATTEMPT_KEY, ItemAttempt, Recorder
from pytest_haico.ledger.records import ErrorInfo
from pytest_haico.ledger.verdicts import Verdict
from pytest_haico.runner.arm_runs import ArmRuns

ITEM_PARAM = "haico_item"
# A test asking for either runs the campaign: haico_conversation asks for haico_item, and
# haico_client for haico_stack.
_CAMPAIGN_FIXTURES = frozenset({ITEM_PARAM, "haico_stack"})
_log = logging.getLogger(__name__)


class CampaignPlugin:
    """Parametrises haico items and carries them through selection, resume and recording."""

    def __init__(
        self,
        settings: Settings,
        specs: list[ItemSpec],
        recorder: Recorder,
        sessions: ArmRuns,
        *,
        collects_experiments: bool = False,
        run_items: Path | None = None,
    ) -> None:
        self.settings = settings
        self.run_items = run_items  # where a batch job wants this run's ledgers and items
        self.collects_experiments = collects_experiments
        self.parametrized = False  # whether any collected test asked for haico_item
        self.specs = specs
        self.recorder = recorder
        self.sessions = sessions
        self.signals = SessionSignals(sessions, drain_timeout_s=settings.drain_timeout)
        self.selection = Selection()
        self.selector = Selector(settings, recorder, self.selection)
        self.interrupted = False
        self._items: list[pytest.Item] = []
        self._reported: set[str] = set()  # nodeids in pytest's own counts
        self._failed_verdicts: dict[str, str] = {}  # nodeid -> the verdict of its failure

    # -- collection ---------------------------------------------------------------------

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        if ITEM_PARAM not in metafunc.fixturenames:
            return
        self.parametrized = True
        if hasattr(metafunc.config, "workerinput"):
            raise pytest.UsageError(XDIST_MESSAGE)

        params = [
            pytest.param(
                spec,
                id=spec.test_id,
                marks=[
                    pytest.mark.haico_item(spec),
                    *(getattr(pytest.mark, t) for t in spec.script.tags),
                ],
            )
            for spec in self.specs
        ]
        metafunc.parametrize(ITEM_PARAM, params)

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_collection_modifyitems(
        self, config: pytest.Config, items: list[pytest.Item]
    ) -> Generator[None, None, None]:
        # Outermost wrapper: after -k/-m and any reordering plugin (--ff, random order)
        # have run, select and group what is left.
        yield
        if not self.collects_experiments and _asks_for_campaign(items):
            # Collected from elsewhere (plugin.py installed none at configure): a test of
            # the campaign runs, and a signal must stop it the campaign's way.
            self.signals.install()
        self._select(config, items)
        if self.settings.gates_only and items:
            # The gates are the whole run: nothing is recorded, nothing is skipped.
            self.selection.gated = len(items)
            config.hook.pytest_deselected(items=list(items))
            items[:] = []

    def _select(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        if not self.parametrized:
            self._without_item_module(items)
            return
        specs: dict[str, ItemSpec] = {}
        for item in items:
            spec = _spec_of(item)
            if spec is not None:
                specs[item.nodeid] = spec
        if not specs:
            return
        keyword = config.option.keyword
        note = describe_k_beyond_arms(keyword, self.specs, specs.values()) if keyword else None
        if note is not None and not self.settings.arms:
            self.selection.notes.append(f"haico: {note}")
        try:
            listing = bool(config.option.collectonly)
            keep, deselected = self.selector.select(
                items, specs, claim=not listing, listing=listing
            )
        except ResultsError as exc:  # before anything starts
            raise pytest.UsageError(f"haico: {exc}") from None
        if deselected:
            config.hook.pytest_deselected(items=deselected)
        items[:] = group_by_arm(keep, lambda item: _arm_of(specs, item))

    def _without_item_module(self, items: list[pytest.Item]) -> None:
        """No test asked for haico_item: say what to write, unless one exists uncollected."""
        root = self.settings.experiments
        if has_item_module(root):
            return
        error = not items and self.collects_experiments
        message = "haico: " + describe_missing_item_module(root, nothing_collected=error)
        if error:
            raise pytest.UsageError(message)
        self.selection.notes.extend(message.split("\n"))

    def pytest_report_collectionfinish(self, config: pytest.Config) -> list[str]:
        return self.selection.status_lines(self.settings)

    # -- running and recording ----------------------------------------------------------

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session: pytest.Session) -> bool | None:
        if session.config.option.collectonly:
            return None
        if self.settings.gates_only:
            return self._gates_only(session)
        # Claim each arm's run directory before its first item: a collision shows now,
        # not after the first conversation.
        for arm in sorted({s.spec.arm.name for s in _attempts(session.items)}):
            try:
                self.recorder.claim(arm)
            except ResultsError as exc:
                raise pytest.UsageError(f"haico: {exc}") from None
        self._items = list(session.items)
        self._tell_run_items()
        self.sessions.plan(session, session.items)
        if session.testsfailed and not session.config.option.continue_on_collection_errors:
            return None  # pytest's loop stops on the collection errors
        if not self.sessions.preflight():
            return True  # a static gate failed: no item runs (exit 78, the summary says why)
        return None

    def _tell_run_items(self) -> None:
        """Tell the batch job what this run is to record where, so that it can decide its
        exit code if pytest is killed before it gives one."""
        if self.run_items is None:
            return
        ledgers = self.recorder.ledger_paths()
        items: dict[Path, list[str]] = {}
        for state in _attempts(self._items):
            items.setdefault(ledgers[state.spec.arm.name], []).append(state.spec.item_id)
        try:
            write_run_items(self.run_items, items)
        except OSError as exc:  # then a killed run's job exits 75, which resubmits it
            _log.warning("haico: %s not written: %s", self.run_items, exc)

    def _gates_only(self, session: pytest.Session) -> bool | None:
        """--haico-gates-only: each selected arm's gates (its stack started and stopped), and
        no item; pytest's own loop has nothing to run (every item was deselected)."""
        if session.testsfailed and not session.config.option.continue_on_collection_errors:
            return None  # pytest's loop stops on the collection errors
        for arm, specs in sorted(self.selection.in_scope.items()):
            self.sessions.run_gates_only(arm, specs)
        return True

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        state = item.stash.get(ATTEMPT_KEY, None)
        if state is None or state.recorded is not None:
            return
        reason = self.sessions.early.not_starting(state)
        if reason is not None:
            pytest.skip(f"haico: not started: {reason}")

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_teardown(self, item: pytest.Item) -> None:
        self.sessions.after(item)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(
        self, item: pytest.Item, nextitem: pytest.Item | None
    ) -> Generator[None, object, object]:
        state = item.stash.get(ATTEMPT_KEY, None)
        if state is not None:
            state.clock.start()
        try:
            result = yield
            self.sessions.early.stop_before(item.session, nextitem)
            return result
        except (KeyboardInterrupt, pytest.exit.Exception) as exc:
            if state is not None and not self.sessions.holds_conversation(state):
                message = str(exc) or "the session was interrupted"
                # A failed write must not hide the interrupt; the recorder keeps the failure.
                with contextlib.suppress(LedgerWriteError), self.signals.deferred():
                    self._record(
                        state,
                        Verdict.INTERRUPTED,
                        error=ErrorInfo(kind="interrupted", message=message),
                    )
            self.interrupted = True
            raise

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        report = yield
        if report.when == "call" or not report.passed:
            self._reported.add(item.nodeid)
        state = item.stash.get(ATTEMPT_KEY, None)
        if state is None:
            return report
        if state.recorded is None:
            self._record_report(item, call, report, state)
        verdict = state.recorded.value if state.recorded is not None else None
        # A user's own assertion on a completed conversation is a failure, not a verdict.
        if report.failed and report.when != "teardown" and verdict not in (None, "completed"):
            self._failed_verdicts[item.nodeid] = verdict
        if report.failed and not isinstance(report.longrepr, str):  # a ledger failure's is
            compact_failure(item, call, report, verdict=verdict, transcript=self._transcript(state))
        return report

    @pytest.hookimpl(wrapper=True)
    def pytest_report_teststatus(
        self, report: pytest.TestReport
    ) -> Generator[None, object, object]:
        status = yield
        verdict = self._failed_verdicts.get(report.nodeid)
        if verdict is None or not report.failed or report.when == "teardown":
            return status
        return with_verdict(status, verdict)

    def _record_report(
        self,
        item: pytest.Item,
        call: pytest.CallInfo[None],
        report: pytest.TestReport,
        state: ItemAttempt,
    ) -> None:
        """The record of an item whose work was not the runner's conversation (or that
        failed before it started), from its report."""
        if call.excinfo is not None and isinstance(call.excinfo.value, StackError):
            return  # the arm's stack is not up: no conversation ran, none is recorded
        if call.excinfo is not None and isinstance(call.excinfo.value, LedgerWriteError):
            return  # the runner could not record it: the run is stopping
        verdict = _verdict_of(report, call)
        if verdict is None:
            return
        error = None
        if call.excinfo is not None and verdict is not Verdict.COMPLETED:
            # The recorder redacts, then caps the message.
            error = ErrorInfo(kind=call.excinfo.typename, message=str(call.excinfo.value))
        try:
            with self.signals.deferred():
                self._record(state, verdict, error=error)
        except LedgerWriteError as exc:
            # Not on disk, so not passed: the item runs again on the next run.
            report.outcome = "failed"
            report.longrepr = f"haico: {exc}"
            item.session.shouldstop = "haico: a ledger record could not be written"

    def _record(self, state: ItemAttempt, verdict: Verdict, *, error: ErrorInfo | None) -> None:
        """Record the attempt, and tell the job log (the runner tells it of its own)."""
        record = self.recorder.record(state, verdict, error=error)
        observer = self.sessions.observer
        if record is not None and observer is not None:
            try:
                observer.recorded(state, record)
            except Exception:  # the record is on disk: telling of it must not undo that
                _log.exception("haico: the job log failed on a record")

    def _transcript(self, state: ItemAttempt) -> Path | None:
        """Where the attempt's transcript is, if this run claimed the arm's run directory."""
        arm = state.spec.arm.name
        if arm not in self.recorder.ledger_paths():
            return None  # never claimed: nothing of it was written
        run_id = self.recorder.claim(arm).run_id  # claimed already: no side effect
        return self.recorder.paths(arm).transcript(state.spec.item_id, run_id, state.attempt)

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if self.selection.all_done and not self.settings.gates_only:
            terminalreporter.section("haico")
            terminalreporter.write_line(self.selection.all_done_line(self.settings))
            return
        write_summary(
            terminalreporter,
            self.recorder,
            self.sessions,
            _attempts(self._items),
            self._reported,
        )

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        # Conversations still in flight (Ctrl-C, a tripped breaker, -x) are cancelled and
        # recorded interrupted here, at once: whatever stopped the session early wants it now.
        self.sessions.stop_all()
        self.recorder.close()
        status = exit_status(
            int(exitstatus),
            mode=self.settings.exit_mode,
            recorder=self.recorder,
            sessions=self.sessions,
            interrupted=self.interrupted,
        )
        if status == pytest.ExitCode.NO_TESTS_COLLECTED and self.selection.all_done:
            # Every selected item is done: a finished campaign, not an empty selection.
            status = pytest.ExitCode.OK
        session.exitstatus = status
        for run in self.sessions.runs.values():
            run.timeline.exit(int(status))


def _asks_for_campaign(items: list[pytest.Item]) -> bool:
    return any(_CAMPAIGN_FIXTURES.intersection(getattr(i, "fixturenames", ())) for i in items)


def _spec_of(item: pytest.Item) -> ItemSpec | None:
    marker = item.get_closest_marker("haico_item")
    if marker is None or not marker.args or not isinstance(marker.args[0], ItemSpec):
        return None
    return marker.args[0]


def _arm_of(specs: dict[str, ItemSpec], item: pytest.Item) -> str | None:
    spec = specs.get(item.nodeid)
    return spec.arm.name if spec is not None else None


def _attempts(items: list[pytest.Item]) -> list[ItemAttempt]:
    return [state for item in items if (state := item.stash.get(ATTEMPT_KEY, None)) is not None]


def _verdict_of(report: pytest.TestReport, call: pytest.CallInfo[None]) -> Verdict | None:
    raised = call.excinfo.value if call.excinfo is not None else None
    if report.when == "setup" and report.failed:
        return Verdict.RATE_LIMITED if isinstance(raised, RateLimitedError) else Verdict.INFRA_ERROR
    if report.when != "call" or report.skipped:
        return None
    if report.passed:
        return Verdict.COMPLETED
    if isinstance(raised, RateLimitedError):
        return Verdict.RATE_LIMITED
    if isinstance(raised, InfraError):
        return Verdict.INFRA_ERROR
    return Verdict.EXPECTATION_FAILED
