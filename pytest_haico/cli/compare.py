"""`haico compare A B [--max-drop SHARE] [--confidence C] [--plan] [--exit-on-regression]`:
how B's newest records differ from A's, paired item by item, and whether B is worse."""

from __future__ import annotations

import argparse

from pytest_haico.cli import arguments
from pytest_haico.cli.output import warn
from pytest_haico.results import paused_gc


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    compare = commands.add_parser(
        "compare", help="verdict changes, latency and token deltas, provenance differences"
    )
    compare.add_argument(
        "a",
        metavar="A",
        help="baseline: a campaign or arm directory (a path, or <campaign>[/<arm>] under the "
        "results root), a run (DIR@RUN_ID, DIR@latest, DIR@previous: every run before the "
        "latest, <arm>/runs/<run_id> or <arm>/ledger/<run_id>.jsonl)",
    )
    compare.add_argument("b", metavar="B", help="the one compared with A, in the same forms")
    arguments.add_gate_options(compare)
    arguments.add_project_options(compare)
    compare.add_argument(
        "--plan",
        action="store_true",
        help="print the items needed to show a drop (--drop, default the measured one) at "
        "--confidence and --power, and their cost from B's measured allocation",
    )
    compare.add_argument(
        "--drop",
        type=arguments.share(0.0, 1.0),
        metavar="SHARE",
        help="the drop --plan sizes for (default: the measured one)",
    )
    compare.add_argument(
        "--power",
        type=arguments.share(0.5, 1.0, closed=False),
        default=0.8,
        metavar="P",
        help="of --plan (default 0.8)",
    )
    compare.add_argument(
        "--exit-on-regression",
        action="store_true",
        help="the strict per-item rule: exit 1 when any one item completed in A and not in "
        "B, however flaky (--max-drop is the statistical gate)",
    )
    compare.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from pytest_haico.report.compare import print_comparison
    from pytest_haico.report.paired import Gate, Plan

    gate = Gate(args.max_drop, args.confidence) if args.max_drop is not None else None
    plan = Plan(args.drop, args.power) if args.plan else None
    with paused_gc():  # the records stay alive: the collector would walk them for nothing
        printed = print_comparison(
            arguments.results_operand(args, args.a),
            arguments.results_operand(args, args.b),
            say=print,
            warn=warn,
            gate=gate,
            plan=plan,
            pass_rule=args.pass_rule,
            confidence=args.confidence,
        )
        failed = printed.decision is not None and printed.decision.failed
        status = 1 if failed or (args.exit_on_regression and printed.regressions) else 0
        if args.finish is not None:  # ends the process while the records are still in memory
            args.finish(status)
    return status
