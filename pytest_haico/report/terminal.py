"""The terminal report (`haico report`): a campaign's verdicts, turns, latency, tokens,
retries, reruns, start-up and provenance per arm × stratum, as a table (the HTML report
is `html`)."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from pytest_haico.files import DEFAULT_FILE_MODE
from pytest_haico.report.allocation import allocation_lines
from pytest_haico.report.data import (
    REPORT_FIELDS,
    Report,
    build_report,
    count,
    factored_provenance,
    seconds,
)
from pytest_haico.report.nodes import NODE_FIELDS, node_lines
from pytest_haico.report.paired import comparison_lines, interval_note, rate_text
from pytest_haico.results import load_results

Say = Callable[[str], None]

_HEAD = (
    "arm",
    "stratum",
    "items",
    "turns",
    "median",
    "p95",
    "tokens in",
    "tokens out",
    "retries",
    "reruns",
    "gave up",
    "pass rate [95%]",
    "verdicts",
)


def table(rows: Sequence[tuple[str, ...]]) -> Iterator[str]:
    """Rows as aligned columns (the last one left free)."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        cells = [
            cell.ljust(width) if i < 2 else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=False))
        ]
        yield "  ".join([*cells, row[-1]]).rstrip()


def report_lines(report: Report) -> Iterator[str]:
    """The terminal report, line by line."""
    results = report.results
    yield (
        f"{results.path}: {len(report.newest):,} items, {len(results.attempts):,} records, "
        f"{len({(r.arm, r.run_id) for r in report.runs}):,} runs"
    )
    rows: list[tuple[str, ...]] = [_HEAD]
    for cell in report.cells:
        rows.append(
            (
                cell.arm,
                cell.stratum,
                count(cell.items),
                count(cell.turns),
                seconds(cell.median_s),
                seconds(cell.p95_s),
                count(cell.tokens_in),
                count(cell.tokens_out),
                count(cell.retries),
                count(cell.reruns),
                count(cell.gave_up),
                rate_text(cell.passed, cell.items),
                cell.verdict_text(),
            )
        )
    yield ""
    yield from table(rows)
    yield (
        "  (each item's newest record: median and p95 item seconds of those that ran to their "
        "own end; retries: attempts after an infrastructure failure or an interruption; "
        "reruns: records after the item was done, --haico-no-resume; "
        f"{interval_note()})"
    )
    by_node = list(node_lines(results))
    if by_node:
        yield ""
        yield from by_node
    yield ""
    yield from _startup_lines(report)
    yield from allocation_lines(report.runs)
    yield from _adaptation_lines(report)
    yield ""
    yield from _provenance_lines(report)
    if results.orphans:
        yield ""
        yield (
            f"{len(results.orphans)} transcript(s) of attempts without a record (killed "
            f"mid-item), e.g. {results.orphans[0].path}"
        )


def _startup_lines(report: Report) -> Iterator[str]:
    arms = sorted({run.arm for run in report.runs})
    for arm in arms:
        measured = [r.startup_s for r in report.runs if r.arm == arm and r.startup_s is not None]
        if measured:
            yield (
                f"stack start-up, {arm}: median {seconds(statistics.median(measured))}, "
                f"max {seconds(max(measured))} over {len(measured)} run(s) "
                "(run directory claimed → first item)"
            )
        else:
            yield (
                f"stack start-up, {arm}: not measured (no run that started its own stack "
                "left claim.json; runs attached to a kept stack started none)"
            )


def _adaptation_lines(report: Report) -> Iterator[str]:
    if report.recorded_adaptations:
        for cell in report.cells:
            yield f"adaptations, {cell.arm} {cell.stratum}: {cell.adaptations}"
        return
    adapted = [run for run in report.runs if run.adaptations]
    yield (
        "adaptations: the ledger records none; from each run's run-config (keys naming "
        "ADAPT): " + ("none" if not adapted else f"{len(adapted)} run(s), below")
    )
    for run in adapted:
        yield f"  {run.arm} {run.run_id}: " + "; ".join(run.adaptations)


def _provenance_lines(report: Report) -> Iterator[str]:
    yield "runs (provenance from runs/<run_id>/run-config.json):"
    shared, own = factored_provenance(report.runs)
    if shared:
        yield "  in every run-config: " + "; ".join(
            f"{key}={value}" for key, value in shared.items()
        )
    for run, values in zip(report.runs, own, strict=True):
        text = "; ".join(f"{key}={value}" for key, value in values.items())
        shown = text or ("no run-config.json" if not run.config else "")
        yield (
            f"  {run.arm} {run.run_id}: {run.records:,} records, start-up "
            f"{seconds(run.startup_s)}" + (f"; {shown}" if shown else "")
        )


def print_report(
    campaign: Path,
    *,
    html: Path | None,
    say: Say,
    warn: Say,
    html_mode: int = DEFAULT_FILE_MODE,
    baseline: str | None = None,
) -> Report:
    """Print the campaign's terminal report; with `html`, also write the HTML report there
    (with file mode `html_mode`); with `baseline` (an operand of `haico compare`), a paired
    comparison section of the campaign (B) against it (A). The report's records stay alive
    until the caller lets the report go."""
    if html is not None:
        from pytest_haico.report.html import check_plotting

        check_plotting()  # before the slow part: say what to install at once
    # The terminal report needs of each item's newest record only what `build_report`
    # reads: the rest is streamed (the HTML report's plots and transcripts need it all).
    if html is None and baseline is None:
        fields = (*REPORT_FIELDS, *NODE_FIELDS)
        results = load_results(campaign, warn=None, newest_only=True, fields=fields)
    else:
        results = load_results(campaign, warn=None)
    for message in results.warnings[:5]:
        warn(f"ledger warning: {message}")
    if len(results.warnings) > 5:
        warn(f"{len(results.warnings) - 5} more ledger warnings")
    report = build_report(results)
    for line in report_lines(report):
        say(line)
    paired = None
    if baseline is not None:
        from pytest_haico.report.compare import load_operand
        from pytest_haico.report.paired import resolve_pass_rule
        from pytest_haico.results.paired import compare_records

        a = load_operand(baseline)
        rule = resolve_pass_rule(None, a, results)  # the one the runs recorded, if any
        comparison = compare_records(a.newest(), report.newest, pass_rule=rule)
        say("")
        say(f"paired comparison: A = {a.path} (--baseline), B = {results.path} (this report)")
        for line in comparison_lines(comparison):
            say(line)
        paired = (comparison, str(a.path), str(results.path))
    if html is not None:
        from pytest_haico.report.html import write_html

        write_html(report, html, mode=html_mode, paired=paired)
        say(f"\nHTML report: {html}")
    return report
