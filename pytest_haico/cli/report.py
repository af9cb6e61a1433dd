"""`haico report <results>/<campaign> [--html FILE]`: the terminal report, and the HTML one."""

from __future__ import annotations

import argparse
from pathlib import Path

from pytest_haico.cli import arguments
from pytest_haico.cli.output import Finish, Say, warn
from pytest_haico.results import load_results, paused_gc


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    report = commands.add_parser(
        "report", help="verdicts, turns, latency, tokens and provenance per arm × stratum"
    )
    report.add_argument(
        "campaign",
        help="the campaign directory, <results>/<campaign>, or its name under the results root",
    )
    report.add_argument(
        "--html", type=Path, metavar="FILE", help="also write a self-contained HTML report"
    )
    arguments.add_project_options(report)
    report.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    return run_report(
        arguments.campaign_dir(args), html=args.html, say=print, warn=warn, finish=args.finish
    )


def run_report(
    campaign: Path, *, html: Path | None, say: Say, warn: Say, finish: Finish | None = None
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
