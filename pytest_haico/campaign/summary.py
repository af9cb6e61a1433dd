"""The end of a campaign session: the haico section of the terminal summary (with the gates'
tables under --haico-gates-only), and the exit code (pytest's own in strict mode; 0
finished, 75 resubmit in campaign mode; in both, 78 a gate failed or no stack, and 75 the
walltime gate found too little time for one item: a cost shortfall, not a fault)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

import pytest

from pytest_haico.config.settings import ExitMode
from pytest_haico.gates.result import first_failure, render_table
from pytest_haico.gates.static import WALLTIME
from pytest_haico.ledger.recorder import ItemAttempt, Recorder
from pytest_haico.ledger.verdicts import Verdict
from pytest_haico.runner.arm_runs import ArmRuns

EXIT_RESUBMIT = 75
EXIT_STACK_FAILED = 78


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
    ledger_failure = _ledger_failure(recorder, sessions)
    gated = sessions.settings.gates_only and bool(sessions.gate_logs)
    quiet = not (_stopped_short(sessions) or ledger_failure or sessions.stack_failure or gated)
    if not verdicts and quiet:
        return
    attempts = list(attempts)
    terminal.section("haico")
    if gated:
        _write_gate_tables(terminal, sessions)
    if sessions.stack_failure and _short_of_time(sessions):
        terminal.write_line(
            f"too little time left (exit {EXIT_RESUBMIT}: a cost shortfall, the inputs are "
            f"fine): {sessions.stack_failure}",
            red=True,
        )
    elif sessions.stack_failure:
        what = "gate failed" if sessions.failed_gate else "stack failed"
        terminal.write_line(
            f"{what} (exit {EXIT_STACK_FAILED}): {sessions.stack_failure}", red=True
        )
    for reason in (sessions.stop_reason, ledger_failure):
        if reason:
            terminal.write_line(f"stopped (exit {EXIT_RESUBMIT}): {reason}", red=True)
    for line in _early_end_lines(sessions, attempts):
        terminal.write_line(line, red=True)
    ledgers = recorder.ledger_paths()
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
        terminal.write_line(f"  ledger:      {ledgers[arm]}")
        transcripts = recorder.paths(arm).transcripts_dir
        if transcripts.is_dir():
            terminal.write_line(f"  transcripts: {transcripts}")
        run = sessions.runs.get(arm)
        if run is not None and run.dumps is not None and run.dumps.written:
            terminal.write_line(f"  dumps:       {run.dumps.dumps_dir}")
        for line in run.timeline.lines() if run is not None else ():
            terminal.write_line(f"  {line}")
        if sessions.kept is not None:
            terminal.write_line(f"  kept stack:  {sessions.kept.directory} (its logs and dumps)")
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
    if sessions.stack_failure is not None:
        return EXIT_RESUBMIT if _short_of_time(sessions) else EXIT_STACK_FAILED
    if _stopped_short(sessions) or recorder.write_failure is not None:
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


def _early_end_lines(sessions: ArmRuns, attempts: list[ItemAttempt]) -> list[str]:
    """What a drain, the walltime or SIGTERM did to the items of this run."""
    interrupted = sum(1 for state in attempts if state.recorded is Verdict.INTERRUPTED)
    not_started = sum(1 for state in attempts if state.recorded is None)
    tally = f"{interrupted} recorded interrupted, {not_started} not started"
    lines = []
    if sessions.emergency is not None:
        periodic = any(
            path.name.startswith("periodic-")
            for run in sessions.runs.values()
            if run.dumps is not None
            for path in run.dumps.written
        )
        newest = " (the newest periodic dump is the last)" if periodic else ""
        lines.append(
            f"terminated (exit {EXIT_RESUBMIT}): {sessions.emergency}; {tally}; "
            f"no final dump{newest}"
        )
    drain = sessions.drain
    if drain is not None:
        if drain.ended_early:
            how = "ended early by a second USR1"
        elif sessions.emergency is not None:
            how = "cut short by SIGTERM"
        else:
            how = "then cancelled"
        lines.append(
            f"drained (exit {EXIT_RESUBMIT}): {drain.reason}: {drain.in_flight} conversation(s) "
            f"in flight were given --haico-drain-timeout {drain.timeout_s:g} s, {how}; {tally}"
        )
    if sessions.admission_stop is not None:
        lines.append(
            f"stopped admitting (exit {EXIT_RESUBMIT}): {sessions.admission_stop}; {tally}"
        )
    return lines


def _short_of_time(sessions: ArmRuns) -> bool:
    """The walltime gate refused: the allocation has less time left than one item costs."""
    return sessions.failed_gate == WALLTIME


def _stopped_short(sessions: ArmRuns) -> bool:
    """A breaker, a dead service, a drain, the walltime or SIGTERM ended the run early."""
    return any(
        reason is not None
        for reason in (
            sessions.stop_reason,
            sessions.drain,
            sessions.admission_stop,
            sessions.emergency,
        )
    )


def _ledger_failure(recorder: Recorder, sessions: ArmRuns) -> str | None:
    """Why a record could not be written, unless the runner stopped the run on it."""
    failure = recorder.write_failure
    if failure is None or str(failure) == sessions.stop_reason:
        return None
    return str(failure)


def _by_precedence(counter: Counter[Verdict]) -> list[tuple[Verdict, int]]:
    order = list(Verdict)
    return sorted(counter.items(), key=lambda pair: order.index(pair[0]))
