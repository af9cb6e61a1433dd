"""`haico compare A B [--exit-on-regression]`: how B's newest records differ from A's."""

from __future__ import annotations

import argparse

from pytest_haico.cli.output import Finish, Say, warn
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
    return run_compare(
        args.a,
        args.b,
        exit_on_regression=args.exit_on_regression,
        say=print,
        warn=warn,
        finish=args.finish,
    )


def run_compare(
    a: str, b: str, *, exit_on_regression: bool, say: Say, warn: Say, finish: Finish | None = None
) -> int:
    """Print the comparison; 1 with `exit_on_regression` when B regressed, else 0.
    `finish`, if given, is called with that status while the records are still in memory."""
    from pytest_haico.report.compare import compare_lines, load_operand

    with paused_gc():  # the records stay alive: the collector would walk them for nothing
        sides = [load_operand(a), load_operand(b)]
        for label, results in zip("AB", sides, strict=True):
            for message in results.warnings[:5]:
                warn(f"ledger warning ({label}): {message}")
        lines, regressions = compare_lines(*sides)
        for line in lines:
            say(line)
        status = 1 if exit_on_regression and regressions else 0
        if finish is not None:
            finish(status)
    return status
