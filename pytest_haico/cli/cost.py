"""`haico cost <results>/<campaign>`: measured item costs, and the array size and --time to
ask for."""

from __future__ import annotations

import argparse
import sys

from pytest_haico.cli import arguments
from pytest_haico.config.bounds import MAX_CONCURRENCY


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    cost = commands.add_parser(
        "cost", help="measured item costs and the array size and --time to ask for"
    )
    cost.add_argument(
        "campaign",
        help="the campaign directory, <results>/<campaign>, or its name under the results root",
    )
    cost.add_argument(
        "--concurrency",
        type=arguments.bounded_int(MAX_CONCURRENCY),
        help=f"instead of each arm's (1 to {MAX_CONCURRENCY})",
    )
    cost.add_argument(
        "--margin",
        type=arguments.margin,
        default=1.5,
        help="factor on the measured work (default 1.5)",
    )
    arguments.add_project_options(cost)
    cost.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from pytest_haico.report.cost import cost_lines
    from pytest_haico.slurm.client import SlurmError
    from pytest_haico.slurm.timelimits import Partition, read_partitions

    try:
        partitions: list[Partition] | None = read_partitions()
    except SlurmError:
        partitions = None
    places = arguments.places(args)
    experiments = places.experiments_given or places.experiments.is_dir()
    for line in cost_lines(
        arguments.campaign_dir(args, places),
        places.experiments if experiments else None,
        concurrency=args.concurrency,
        margin=args.margin,
        partitions=partitions,
        warn=lambda message: print(f"haico: ledger warning: {message}", file=sys.stderr),
    ):
        print(line)
    return 0
