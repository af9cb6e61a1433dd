"""The campaign's life in a pytest session: items, selection, resume, records, exit code."""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Generator
from dataclasses import dataclass, field

import pytest

from pytest_haico.config.items import (
    ItemSpec,
    describe_k_beyond_arms,
    describe_missing_item_module,
    first_per_stratum,
    group_by_arm,
    has_item_module,
    in_shard,
)
from pytest_haico.config.settings import ExitMode, Settings
from pytest_haico.errors import (
    InfraError,
    LedgerWriteError,
    RateLimitedError,
    ResultsError,
    StackError,
)
from pytest_haico.ledger.jsonl import iter_ledger_dir
from pytest_haico.ledger.recorder import ATTEMPT_KEY, ItemAttempt, Recorder, utc_now
from pytest_haico.ledger.records import ErrorInfo
from pytest_haico.ledger.resume import ResumeIndex
from pytest_haico.ledger.verdicts import Verdict
from pytest_haico.runner.arm_runs import ArmRuns
from pytest_haico.runner.skips import is_skipped_by_marks

ITEM_PARAM = "haico_item"
EXIT_RESUBMIT = 75
EXIT_STACK_FAILED = 78
_MAX_WARNINGS_SHOWN = 10


@dataclass
class Selection:
    """What collection decided, for the status line and the summary."""

    done: int = 0
    to_run: int = 0
    retries: int = 0  # to run again after an infra failure: each is one more attempt
    resumed: int = 0  # to run again after an interruption, which is no attempt
    skipped_by_marks: int = 0
    out_of_shard: int = 0
    over_limit: int = 0
    not_selected: int = 0
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # hints on how this run selected items


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
    ) -> None:
        self.settings = settings
        self.collects_experiments = collects_experiments
        self.parametrized = False  # whether any collected test asked for haico_item
        self.specs = specs
        self.recorder = recorder
        self.sessions = sessions
        self.selection = Selection()
        self.interrupted = False
        self._items: list[pytest.Item] = []
        self._reported: set[str] = set()  # nodeids in pytest's own counts

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
            keep, deselected = self._select(items, specs, claim=not config.option.collectonly)
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

    def _select(
        self, items: list[pytest.Item], specs: dict[str, ItemSpec], *, claim: bool
    ) -> tuple[list[pytest.Item], list[pytest.Item]]:
        settings = self.settings
        selection = self.selection
        candidates: list[pytest.Item] = []
        deselected: list[pytest.Item] = []
        for item in items:
            spec = specs.get(item.nodeid)
            if spec is None:
                candidates.append(item)
            elif not _is_selected(spec, settings):
                selection.not_selected += 1
                deselected.append(item)
            elif not in_shard(spec.item_id, settings.shard):
                selection.out_of_shard += 1
                deselected.append(item)
            else:
                candidates.append(item)
        if settings.limit_per_stratum is not None:
            in_limit = first_per_stratum(
                (specs[i.nodeid] for i in candidates if i.nodeid in specs),
                settings.limit_per_stratum,
            )
            within: list[pytest.Item] = []
            for item in candidates:
                spec = specs.get(item.nodeid)
                if spec is None or spec.ordinal in in_limit:
                    within.append(item)
                else:
                    selection.over_limit += 1
                    deselected.append(item)
            candidates = within
        if claim:
            self._claim(candidates, specs)
        indexes = self._resume_indexes(
            {specs[i.nodeid].arm.name for i in candidates if i.nodeid in specs}
        )
        keep: list[pytest.Item] = []
        for item in candidates:
            spec = specs.get(item.nodeid)
            if spec is None:
                keep.append(item)
                continue
            index = indexes.get(spec.arm.name)
            prior = index.get(spec.item_id) if index is not None else None
            if prior is not None and prior.done:
                selection.done += 1
                deselected.append(item)
                continue
            attempt = prior.next_attempt if prior is not None else 1
            # A skipped item keeps its attempt: should pytest run it after all, it can.
            item.stash[ATTEMPT_KEY] = ItemAttempt(spec=spec, nodeid=item.nodeid, attempt=attempt)
            keep.append(item)
            if is_skipped_by_marks(item):
                selection.skipped_by_marks += 1
                continue
            selection.to_run += 1
            if prior is not None and prior.verdict is Verdict.INTERRUPTED:
                selection.resumed += 1
            elif prior is not None:
                selection.retries += 1
        return keep, deselected

    def _claim(self, candidates: list[pytest.Item], specs: dict[str, ItemSpec]) -> None:
        """Claim each arm's run directory and its shares (arm × shard × stratum) before the
        ledgers are read, so that a run of the same share ending meanwhile is read whole."""
        strata: dict[str, set[str]] = {}
        for item in candidates:
            spec = specs.get(item.nodeid)
            if spec is not None:
                strata.setdefault(spec.arm.name, set()).add(spec.stratum)
        for arm in sorted(strata):
            self.recorder.claim(arm, strata[arm])

    def _resume_indexes(self, arms: set[str]) -> dict[str, ResumeIndex]:
        """One index per arm: arms that differ only outside item identity share item_ids."""
        if not self.settings.resume:
            return {}
        indexes: dict[str, ResumeIndex] = {}
        for arm in sorted(arms):
            ledger_dir = self.recorder.paths(arm).ledger_dir
            index = indexes[arm] = ResumeIndex()
            index.add_all(
                iter_ledger_dir(
                    ledger_dir, warn=self.selection.warnings.append, resume_fields=True
                ),
                warn=self.selection.warnings.append,
            )
        return indexes

    def pytest_report_collectionfinish(self, config: pytest.Config) -> list[str]:
        selection = self.selection
        if not (
            selection.to_run
            or selection.done
            or selection.not_selected
            or selection.skipped_by_marks
        ):
            return selection.notes
        lines = [f"haico: ledger warning: {w}" for w in selection.warnings[:_MAX_WARNINGS_SHOWN]]
        if len(selection.warnings) > _MAX_WARNINGS_SHOWN:
            lines.append(
                f"haico: ... and {len(selection.warnings) - _MAX_WARNINGS_SHOWN} more "
                "ledger warnings"
            )
        if self.settings.resume:
            again = f"{selection.retries} retries"
            if selection.resumed:
                again += f", {selection.resumed} resumed after interruption"
            status = f"haico: {selection.done} done in ledger, {selection.to_run} to run ({again})"
        else:
            status = f"haico: resume off (--haico-no-resume), {selection.to_run} to run"
        extras = []
        if self.settings.shard.count > 1:
            extras.append(f"shard {self.settings.shard}: {selection.out_of_shard} in other shards")
        if selection.over_limit:
            extras.append(f"{selection.over_limit} over --haico-limit-per-stratum")
        if selection.skipped_by_marks:
            extras.append(f"{selection.skipped_by_marks} skipped by marks")
        if extras:
            status += "; " + "; ".join(extras)
        lines.append(status)
        return [*lines, *selection.notes]

    # -- running and recording ----------------------------------------------------------

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session: pytest.Session) -> None:
        if session.config.option.collectonly:
            return
        # Claim each arm's run directory before its first item: a collision shows now,
        # not after the first conversation.
        for arm in sorted({s.spec.arm.name for s in _attempts(session.items)}):
            try:
                self.recorder.claim(arm)
            except ResultsError as exc:
                raise pytest.UsageError(f"haico: {exc}") from None
        self._items = list(session.items)
        self.sessions.plan(session, session.items)

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_teardown(self, item: pytest.Item) -> None:
        self.sessions.after(item)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Generator[None, object, object]:
        state = item.stash.get(ATTEMPT_KEY, None)
        if state is not None:
            state.started_at = utc_now()
        try:
            return (yield)
        except (KeyboardInterrupt, pytest.exit.Exception):
            if state is not None:
                # A failed write must not hide the interrupt; the recorder keeps the failure.
                with contextlib.suppress(LedgerWriteError):
                    self.recorder.record(
                        state,
                        Verdict.INTERRUPTED,
                        error=ErrorInfo(kind="interrupted", message="the session was interrupted"),
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
        if state is None or state.recorded is not None:
            return report
        if call.excinfo is not None and isinstance(call.excinfo.value, StackError):
            return report  # the arm's stack is not up: no conversation ran, none is recorded
        if call.excinfo is not None and isinstance(call.excinfo.value, LedgerWriteError):
            return report  # the runner could not record it: the run is stopping
        verdict = _verdict_of(report, call)
        if verdict is not None:
            error = None
            if call.excinfo is not None and verdict is not Verdict.COMPLETED:
                # The recorder redacts, then caps the message.
                error = ErrorInfo(kind=call.excinfo.typename, message=str(call.excinfo.value))
            try:
                self.recorder.record(state, verdict, error=error)
            except LedgerWriteError as exc:
                # Not on disk, so not passed: the item runs again on the next run.
                report.outcome = "failed"
                report.longrepr = f"haico: {exc}"
                item.session.shouldstop = "haico: a ledger record could not be written"
        return report

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        verdicts = self.recorder.verdicts
        ledger_failure = self._ledger_failure()
        stopped = self.sessions.stack_failure or self.sessions.stop_reason or ledger_failure
        if not verdicts and not stopped:
            return
        terminalreporter.section("haico")
        if self.sessions.stack_failure:
            terminalreporter.write_line(
                f"stack failed (exit 78): {self.sessions.stack_failure}", red=True
            )
        if self.sessions.stop_reason:
            terminalreporter.write_line(f"stopped (exit 75): {self.sessions.stop_reason}", red=True)
        if ledger_failure:
            terminalreporter.write_line(f"stopped (exit 75): {ledger_failure}", red=True)
        ledgers = self.recorder.ledger_paths()
        unreported = Counter(
            state.spec.arm.name
            for state in _attempts(self._items)
            if state.recorded is not None and state.nodeid not in self._reported
        )
        for arm in sorted(verdicts):
            # The counts are this run's records in the ledger, one per item attempt.
            items = sum(verdicts[arm].values())
            counts = ", ".join(f"{n} {v.value}" for v, n in _by_precedence(verdicts[arm]))
            elapsed = self.sessions.elapsed_s(arm)
            took = f" in {elapsed:.1f} s (stack included)" if elapsed is not None else ""
            terminalreporter.write_line(f"{arm}: {items} item(s){took}: {counts}")
            if unreported[arm]:
                terminalreporter.write_line(
                    f"  {unreported[arm]} of them are not in pytest's counts: the session "
                    "stopped before they were reported"
                )
            terminalreporter.write_line(f"  ledger:      {ledgers[arm]}")
            transcripts = self.recorder.paths(arm).transcripts_dir
            if transcripts.is_dir():
                terminalreporter.write_line(f"  transcripts: {transcripts}")
        owed = self.recorder.owed_retry
        if owed:
            terminalreporter.write_line(f"{owed} item(s) must run again: rerun the same command")

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        # Conversations still in flight (Ctrl-C, a tripped breaker, -x) are cancelled and
        # recorded interrupted here, at once: whatever stopped the session early wants it now.
        self.sessions.stop_all()
        self.recorder.close()
        status = int(exitstatus)
        # In both exit modes: the stack is bad (78), or the run stopped short (75).
        if self.sessions.stack_failure is not None:
            session.exitstatus = EXIT_STACK_FAILED
            return
        if self.sessions.stop_reason is not None or self.recorder.write_failure is not None:
            session.exitstatus = EXIT_RESUBMIT
            return
        if self.settings.exit_mode is ExitMode.STRICT or status == pytest.ExitCode.USAGE_ERROR:
            return
        if self.interrupted or status == pytest.ExitCode.INTERRUPTED or self.recorder.owed_retry:
            session.exitstatus = EXIT_RESUBMIT
        elif status in (
            pytest.ExitCode.OK,
            pytest.ExitCode.TESTS_FAILED,
            pytest.ExitCode.NO_TESTS_COLLECTED,
        ):
            session.exitstatus = pytest.ExitCode.OK

    def _ledger_failure(self) -> str | None:
        """Why a record could not be written, unless the runner stopped the run on it."""
        failure = self.recorder.write_failure
        if failure is None or str(failure) == self.sessions.stop_reason:
            return None
        return str(failure)


XDIST_MESSAGE = (
    "haico: haico items cannot run under pytest-xdist (-n): every worker would start its own "
    "stack and claim its own run. Run conversations concurrently with --haico-concurrency N "
    "(one event loop, one stack), and scale out with Slurm job arrays and --haico-shard I/N."
)


def _is_selected(spec: ItemSpec, settings: Settings) -> bool:
    """--haico-arm and --haico-stratum: exact names, unlike -k's substring match."""
    if settings.arms and spec.arm.name not in settings.arms:
        return False
    return not (settings.strata and spec.stratum not in settings.strata)


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


def _by_precedence(counter: Counter[Verdict]) -> list[tuple[Verdict, int]]:
    order = list(Verdict)
    return sorted(counter.items(), key=lambda pair: order.index(pair[0]))
