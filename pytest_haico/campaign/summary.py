"""The end of a campaign session: the haico section of the terminal summary (with the gates'
tables under --haico-gates-only), and the exit code (pytest's own in strict mode; 0
finished, 75 resubmit in campaign mode; in both, 78 a gate failed or no stack, and 75 the
walltime gate found too little time for one item: a cost shortfall, not a fault)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from pathlib import Path

import pytest

from pytest_haico.config.settings import ExitMode
from pytest_haico.files import shown_path
from pytest_haico.gates.result import first_failure, render_table
from pytest_haico.ledger.recorder import ItemAttempt, Recorder
from pytest_haico.ledger.verdicts import Verdict
from pytest_haico.runner.arm_runs import ArmRuns
from pytest_haico.runner.stopping import EXIT_RESUBMIT, EXIT_STACK_FAILED, StopKind, Stops

__all__ = ["EXIT_RESUBMIT", "EXIT_STACK_FAILED", "exit_status", "write_stop_line", "write_summary"]


def write_summary(
    terminal: pytest.TerminalReporter,
    recorder: Recorder,
    sessions: ArmRuns,
    attempts: Iterable[ItemAttempt],
    reported: set[str],
) -> None:
    """The gates' tables (--haico-gates-only); why the run stopped, if it stopped short; per
    arm: this run's verdicts and paths."""
    verdicts = recorder.verdicts
    stops = sessions.stops
    ledger_failure = _ledger_failure(recorder, stops)
    gated = sessions.settings.gates_only and bool(sessions.gate_logs)
    if not verdicts and stops.first is None and not (ledger_failure or gated):
        return
    attempts = list(attempts)
    terminal.section("haico")
    if gated:
        _write_gate_tables(terminal, sessions)
    for line in _stop_lines(sessions, attempts, ledger_failure=ledger_failure):
        terminal.write_line(line, red=True)
    ledgers = recorder.ledger_paths()
    here = terminal.config.invocation_params.dir

    def shown(path: Path) -> str:
        return shown_path(path, here)

    unreported = Counter(
        state.spec.arm.name
        for state in attempts
        if state.recorded is not None and state.nodeid not in reported
    )
    for arm in sorted(verdicts):
        # The counts are this run's records in the ledger, one per item attempt.
        items = sum(verdicts[arm].values())
        counts = ", ".join(f"{n} {v.value}" for v, n in _by_precedence(verdicts[arm]))
        elapsed = sessions.elapsed_s(arm)
        stack = "attached to the kept stack" if sessions.kept is not None else "stack included"
        took = f" in {elapsed:.1f} s ({stack})" if elapsed is not None else ""
        terminal.write_line(f"{arm}: {items} item(s){took}: {counts}")
        if unreported[arm]:
            terminal.write_line(
                f"  {unreported[arm]} of them are not in pytest's counts: the session "
                "stopped before they were reported"
            )
        terminal.write_line(f"  ledger:      {shown(ledgers[arm])}")
        transcripts = recorder.paths(arm).transcripts_dir
        if transcripts.is_dir():
            terminal.write_line(f"  transcripts: {shown(transcripts)}")
        run = sessions.runs.get(arm)
        if run is not None and run.dumps is not None and run.dumps.written:
            terminal.write_line(f"  dumps:       {shown(run.dumps.dumps_dir)}")
        for line in run.timeline.lines(shown) if run is not None else ():
            terminal.write_line(f"  {line}")
        if sessions.kept is not None:
            terminal.write_line(
                f"  kept stack:  {shown(Path(sessions.kept.directory))} (its logs and dumps)"
            )
        served = sessions.served_model(arm)
        if served is not None:
            terminal.write_line(f"  model:       the served model {served}")
        if run is not None and run.dump_failure:
            terminal.write_line(f"  {run.dump_failure}", red=True)
        for change in run.provenance_changes if run is not None else ():
            terminal.write_line(f"  provenance changed {change}", yellow=True)
    if recorder.owed_retry:
        terminal.write_line(f"{recorder.owed_retry} item(s) must run again: rerun the same command")


def write_stop_line(terminal: pytest.TerminalReporter, line: str) -> None:
    """The haico section of a session that ended before its campaign started: one line."""
    terminal.section("haico")
    terminal.write_line(line, red=True)


def exit_status(
    status: int,
    *,
    mode: ExitMode,
    recorder: Recorder,
    sessions: ArmRuns,
    interrupted: bool,
) -> int:
    """The session's exit code, given pytest's `status` and what the campaign saw."""
    # In both exit modes: a gate failed or the stack is bad (78), or the run stopped short
    # or had too little time for one item (75).
    first = sessions.stops.first
    if first is not None:
        return first.exit_code
    if recorder.write_failure is not None:
        return EXIT_RESUBMIT
    gates_passed = sessions.settings.gates_only and bool(sessions.gate_logs) and not interrupted
    if gates_passed and status in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
        return pytest.ExitCode.OK  # every item was deselected: the gates were the run
    if mode is ExitMode.STRICT or status == pytest.ExitCode.USAGE_ERROR:
        return status
    if interrupted or status == pytest.ExitCode.INTERRUPTED or recorder.owed_retry:
        return EXIT_RESUBMIT
    if status in (
        pytest.ExitCode.OK,
        pytest.ExitCode.TESTS_FAILED,
        pytest.ExitCode.NO_TESTS_COLLECTED,
    ):
        return pytest.ExitCode.OK
    return status


def _write_gate_tables(terminal: pytest.TerminalReporter, sessions: ArmRuns) -> None:
    """--haico-gates-only: per arm, what its gates found, and where gates.json is."""
    for arm, log in sorted(sessions.gate_logs.items()):
        failure = first_failure(log.results)
        if failure is not None:
            verdict = f"gate {failure.name} FAILED"
        elif sessions.failure(arm) is not None:
            verdict = f"{len(log.results)} passed, then the stack did not start"
        else:
            verdict = f"all {len(log.results)} passed"
        terminal.write_line(f"gates of arm {arm}: {verdict} ({log.path})")
        for line in render_table(log.results).splitlines():
            terminal.write_line(f"  {line}")


def _stop_lines(
    sessions: ArmRuns, attempts: list[ItemAttempt], *, ledger_failure: str | None
) -> list[str]:
    """Why the runs stopped short, one line per cause in precedence order (`Stops`), with
    what a drain, the walltime or SIGTERM did to this run's items."""
    interrupted = sum(1 for state in attempts if state.recorded is Verdict.INTERRUPTED)
    not_started = sum(1 for state in attempts if state.recorded is None)
    tally = f"{interrupted} recorded interrupted, {not_started} not started"
    stops = sessions.stops
    # A record the report hook could not write stops the run too: its line goes with the
    # runner's own `stopped` line, after a failed start's, before a signal's.
    ledger = [f"stopped (exit {EXIT_RESUBMIT}): {ledger_failure}"] if ledger_failure else []
    lines: list[str] = []
    for cause in stops:
        kind, code = cause.kind, cause.exit_code
        if ledger and _after_stopped(kind):
            lines, ledger = [*lines, *ledger], []
        if kind is StopKind.SHORT_OF_TIME:
            lines.append(
                f"{kind.value} (exit {code}: a cost shortfall, the inputs are fine): {cause.reason}"
            )
        elif kind.failed_start or kind is StopKind.STOPPED:
            lines.append(f"{kind.value} (exit {code}): {cause.reason}")
        elif kind is StopKind.TERMINATED:
            lines.append(
                f"{kind.value} (exit {code}): {cause.reason}; {tally}; no final dump"
                f"{_newest_periodic(sessions)}"
            )
        elif kind is StopKind.DRAINED and cause.drain is not None:
            drain = cause.drain
            if drain.ended_early:
                how = "ended early by a second USR1"
            elif stops.get(StopKind.TERMINATED) is not None:
                how = "cut short by SIGTERM"
            else:
                how = "then cancelled"
            lines.append(
                f"{kind.value} (exit {code}): {cause.reason}: {drain.in_flight} "
                f"conversation(s) in flight were given --haico-drain-timeout "
                f"{drain.timeout_s:g} s, {how}; {tally}"
            )
        elif kind is StopKind.NOT_ADMITTING:
            lines.append(f"{kind.value} (exit {code}): {cause.reason}; {tally}")
    return [*lines, *ledger]


def _after_stopped(kind: StopKind) -> bool:
    order = list(StopKind)
    return order.index(kind) > order.index(StopKind.STOPPED)


def _newest_periodic(sessions: ArmRuns) -> str:
    """What survives a SIGTERM's skipped final dump, when a periodic dump was written."""
    periodic = any(
        path.name.startswith("periodic-")
        for run in sessions.runs.values()
        if run.dumps is not None
        for path in run.dumps.written
    )
    return " (the newest periodic dump is the last)" if periodic else ""


def _ledger_failure(recorder: Recorder, stops: Stops) -> str | None:
    """Why a record could not be written, unless the runner stopped the run on it."""
    failure = recorder.write_failure
    if failure is None or str(failure) == stops.reason(StopKind.STOPPED):
        return None
    return str(failure)


def _by_precedence(counter: Counter[Verdict]) -> list[tuple[Verdict, int]]:
    order = list(Verdict)
    return sorted(counter.items(), key=lambda pair: order.index(pair[0]))
