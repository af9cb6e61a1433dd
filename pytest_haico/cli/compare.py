"""`haico compare A B [--exit-on-regression]`: how B's newest records differ from A's."""

from __future__ import annotations

import argparse

from pytest_haico.cli.output import warn
from pytest_haico.results import paused_gc


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    compare = commands.add_parser(
        "compare", help="verdict changes, latency and token deltas, provenance differences"
    )
    compare.add_argument(
        "a",
        metavar="A",
        help="baseline: a campaign or arm directory, a run (DIR@RUN_ID, DIR@latest, "
        "DIR@previous, <arm>/runs/<run_id> or <arm>/ledger/<run_id>.jsonl)",
    )
    compare.add_argument("b", metavar="B", help="the one compared with A, in the same forms")
    compare.add_argument(
        "--exit-on-regression",
        action="store_true",
        help="exit 1 when an item completed in A and not in B",
    )
    compare.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from pytest_haico.report.compare import print_comparison

    with paused_gc():  # the records stay alive: the collector would walk them for nothing
        regressions, _ = print_comparison(args.a, args.b, say=print, warn=warn)
        status = 1 if args.exit_on_regression and regressions else 0
        if args.finish is not None:  # ends the process while the records are still in memory
            args.finish(status)
    return status
