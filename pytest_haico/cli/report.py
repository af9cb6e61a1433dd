"""`haico report [<results>/<campaign>] [--html FILE]`: the terminal report, and the HTML one."""

from __future__ import annotations

import argparse
from pathlib import Path

from pytest_haico.cli import arguments
from pytest_haico.cli.output import warn
from pytest_haico.files import DEFAULT_FILE_MODE
from pytest_haico.results import paused_gc


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    report = commands.add_parser(
        "report", help="verdicts, turns, latency, tokens and provenance per arm × stratum"
    )
    arguments.add_campaign_argument(report)
    report.add_argument(
        "--html", type=Path, metavar="FILE", help="also write a self-contained HTML report"
    )
    report.add_argument(
        "--baseline",
        metavar="A",
        help="add a paired comparison of this campaign (B) against A (any operand of haico "
        "compare: a campaign, an arm, a run, DIR@RUN_ID), with a plot of the per-stratum "
        "differences on the HTML page",
    )
    arguments.add_project_options(report)
    report.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from pytest_haico.config.resolution import resolve_results_mode
    from pytest_haico.report.terminal import print_report

    campaign = arguments.campaign_dir(args)
    # The page holds transcripts: it gets the results' mode (0640 unless widened).
    html_mode = resolve_results_mode(arguments.resolver(args)) if args.html else DEFAULT_FILE_MODE
    with paused_gc():  # 100,000 records stay alive: the collector would walk them for nothing
        print_report(
            campaign,
            html=args.html,
            html_mode=html_mode,
            say=print,
            warn=warn,
            baseline=args.baseline,
        )
        if args.finish is not None:  # ends the process while the records are still in memory
            args.finish(0)
    return 0
