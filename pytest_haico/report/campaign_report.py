"""`haico report`'s work: a campaign's records read once, its terminal report printed, and its
HTML report written when asked."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from pytest_haico.results import load_results, paused_gc

Say = Callable[[str], None]


def print_report(
    campaign: Path,
    *,
    html: Path | None,
    say: Say,
    warn: Say,
    finish: Callable[[int], object] | None = None,
) -> int:
    """Print the terminal report; with `html`, also write the HTML report there. `finish`,
    if given, is called with the exit status while the records are still in memory."""
    if html is not None:
        from pytest_haico.report.html import check_plotting

        check_plotting()  # before the slow part: say what to install at once
    with paused_gc():  # 100,000 records stay alive: the collector would walk them for nothing
        results = load_results(campaign, warn=None)
        for message in results.warnings[:5]:
            warn(f"ledger warning: {message}")
        if len(results.warnings) > 5:
            warn(f"{len(results.warnings) - 5} more ledger warnings")
        from pytest_haico.report.data import build_report
        from pytest_haico.report.terminal import report_lines

        report = build_report(results)
        for line in report_lines(report):
            say(line)
        if html is not None:
            from pytest_haico.report.html import write_html

            write_html(report, html)
            say(f"\nHTML report: {html}")
        if finish is not None:
            finish(0)
    return 0
