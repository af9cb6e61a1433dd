"""The campaign's life in a pytest session: items, selection, resume, records, exit code."""

from __future__ import annotations

from collections import Counter
from collections.abc import Generator
from dataclasses import dataclass, field

import pytest

from pytest_haico.config.items import ItemSpec, first_per_stratum, group_by_arm, in_shard
from pytest_haico.config.settings import ExitMode, Settings
from pytest_haico.errors import GateError, InfraError, RateLimitedError, StackError
from pytest_haico.ledger.jsonl import iter_ledger_dir
from pytest_haico.ledger.recorder import ATTEMPT_KEY, ItemAttempt, Recorder, utc_now
from pytest_haico.ledger.records import ErrorInfo
from pytest_haico.ledger.resume import ResumeIndex
from pytest_haico.ledger.verdicts import Verdict
from pytest_haico.runner.arm_runs import ArmRuns

ITEM_PARAM = "haico_item"
EXIT_RESUBMIT = 75
EXIT_GATE_FAILED = 78
_MAX_WARNINGS_SHOWN = 10


@dataclass
class Selection:
    """What collection decided, for the status line and the summary."""

    done: int = 0
    to_run: int = 0
    retries: int = 0
    out_of_shard: int = 0
    over_limit: int = 0
    not_selected: int = 0
    warnings: list[str] = field(default_factory=list)


class CampaignPlugin:
    """Parametrises haico items and carries them through selection, resume and recording."""

    def __init__(
        self,
        settings: Settings,
        specs: list[ItemSpec],
        recorder: Recorder,
        sessions: ArmRuns,
    ) -> None:
        self.settings = settings
        self.specs = specs
        self.recorder = recorder
        self.sessions = sessions
        self.selection = Selection()
        self.interrupted = False

    # -- collection ---------------------------------------------------------------------

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        if ITEM_PARAM not in metafunc.fixturenames:
            return
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
        specs: dict[str, ItemSpec] = {}
        for item in items:
            spec = _spec_of(item)
            if spec is not None:
                specs[item.nodeid] = spec
        if not specs:
            return
        keep, deselected = self._select(items, specs)
        if deselected:
            config.hook.pytest_deselected(items=deselected)
        items[:] = group_by_arm(keep, lambda item: _arm_of(specs, item))

    def _select(
        self, items: list[pytest.Item], specs: dict[str, ItemSpec]
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
                if spec is None or spec.item_id in in_limit:
                    within.append(item)
                else:
                    selection.over_limit += 1
                    deselected.append(item)
            candidates = within
        index = self._resume_index(
            {specs[i.nodeid].arm.name for i in candidates if i.nodeid in specs}
        )
        keep: list[pytest.Item] = []
        for item in candidates:
            spec = specs.get(item.nodeid)
            if spec is None:
                keep.append(item)
                continue
            prior = index.get(spec.item_id) if index is not None else None
            if prior is not None and prior.done:
                selection.done += 1
                deselected.append(item)
                continue
            if prior is not None:
                selection.retries += 1
            attempt = prior.next_attempt if prior is not None else 1
            item.stash[ATTEMPT_KEY] = ItemAttempt(spec=spec, nodeid=item.nodeid, attempt=attempt)
            selection.to_run += 1
            keep.append(item)
        return keep, deselected

    def _resume_index(self, arms: set[str]) -> ResumeIndex | None:
        if not self.settings.resume:
            return None
        index = ResumeIndex()
        for arm in sorted(arms):
            ledger_dir = self.recorder.paths(arm).ledger_dir
            index.add_all(
                iter_ledger_dir(
                    ledger_dir, warn=self.selection.warnings.append, resume_fields=True
                ),
                warn=self.selection.warnings.append,
            )
        return index

    def pytest_report_collectionfinish(self, config: pytest.Config) -> list[str]:
        selection = self.selection
        if not (selection.to_run or selection.done or selection.not_selected):
            return []
        lines = [f"haico: ledger warning: {w}" for w in selection.warnings[:_MAX_WARNINGS_SHOWN]]
        if len(selection.warnings) > _MAX_WARNINGS_SHOWN:
            lines.append(
                f"haico: ... and {len(selection.warnings) - _MAX_WARNINGS_SHOWN} more "
                "ledger warnings"
            )
        if self.settings.resume:
            status = (
                f"haico: {selection.done} done in ledger, {selection.to_run} to run "
                f"({selection.retries} retries)"
            )
        else:
            status = f"haico: resume off (--haico-no-resume), {selection.to_run} to run"
        extras = []
        if self.settings.shard.count > 1:
            extras.append(f"shard {self.settings.shard}: {selection.out_of_shard} in other shards")
        if selection.over_limit:
            extras.append(f"{selection.over_limit} over --haico-limit-per-stratum")
        if extras:
            status += "; " + "; ".join(extras)
        lines.append(status)
        return lines

    # -- running and recording ----------------------------------------------------------

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session: pytest.Session) -> None:
        if session.config.option.collectonly:
            return
        # Claim each arm's run directory before its first item: a collision shows now,
        # not after the first conversation.
        for arm in sorted({s.spec.arm.name for s in _attempts(session.items)}):
            self.recorder.claim(arm)
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
        state = item.stash.get(ATTEMPT_KEY, None)
        if state is None or state.recorded is not None:
            return report
        if call.excinfo is not None and isinstance(call.excinfo.value, GateError | StackError):
            return report  # a gate failure writes gates.json, never a ledger record
        verdict = _verdict_of(report, call)
        if verdict is not None:
            error = None
            if call.excinfo is not None and verdict is not Verdict.COMPLETED:
                error = ErrorInfo(
                    kind=call.excinfo.typename, message=str(call.excinfo.value)[:2000]
                )
            self.recorder.record(state, verdict, error=error)
        return report

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        verdicts = self.recorder.verdicts
        stopped = self.sessions.gate_failure or self.sessions.trip_reason
        if not verdicts and not stopped:
            return
        terminalreporter.section("haico")
        if self.sessions.gate_failure:
            terminalreporter.write_line(
                f"gate failed (exit 78): {self.sessions.gate_failure}", red=True
            )
        if self.sessions.trip_reason:
            terminalreporter.write_line(f"stopped (exit 75): {self.sessions.trip_reason}", red=True)
        ledgers = self.recorder.ledger_paths()
        for arm in sorted(verdicts):
            items = sum(verdicts[arm].values())
            counts = ", ".join(f"{n} {v.value}" for v, n in _by_precedence(verdicts[arm]))
            elapsed = self.sessions.elapsed_s(arm)
            took = f" in {elapsed:.1f} s (stack included)" if elapsed is not None else ""
            terminalreporter.write_line(f"{arm}: {items} item(s){took}: {counts}")
            terminalreporter.write_line(f"  ledger:      {ledgers[arm]}")
            transcripts = self.recorder.paths(arm).transcripts_dir
            if transcripts.is_dir():
                terminalreporter.write_line(f"  transcripts: {transcripts}")
        owed = self.recorder.owed_retry
        if owed:
            terminalreporter.write_line(f"{owed} item(s) must run again: rerun the same command")

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        # In-flight conversations (Ctrl-C, a tripped breaker) are recorded interrupted here.
        self.sessions.stop_all()
        self.recorder.close()
        status = int(exitstatus)
        if self.sessions.gate_failure is not None:
            session.exitstatus = EXIT_GATE_FAILED
            return
        if self.sessions.trip_reason is not None:
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
