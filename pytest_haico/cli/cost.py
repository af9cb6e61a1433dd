"""`haico cost [<results>/<campaign>]`: measured item costs, and the array size and --time to
ask for."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_haico.cli import arguments
from pytest_haico.config.limits import MAX_CONCURRENCY

if TYPE_CHECKING:  # settings imports pytest: every haico command would wait for it
    from pytest_haico.config.resolution import Places
    from pytest_haico.config.settings import Profile


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    cost = commands.add_parser(
        "cost", help="measured item costs and the array size and --time to ask for"
    )
    arguments.add_campaign_argument(cost)
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
    campaign_dir = arguments.campaign_dir(args, places)
    profile, site_image = _identity(args, places, campaign_dir)
    for line in cost_lines(
        campaign_dir,
        places.experiments if experiments else None,
        concurrency=args.concurrency,
        margin=args.margin,
        partitions=partitions,
        warn=lambda message: print(f"haico: ledger warning: {message}", file=sys.stderr),
        profile=profile,
        site_image=site_image,
    ):
        print(line)
    return 0


def _identity(
    args: argparse.Namespace, places: Places, campaign_dir: Path
) -> tuple[Profile, str | None]:
    """The profile and site image the campaign's items get their ids under: the newest
    submission's (what its jobs ran), else the profile pytest resolves (--haico-profile's
    environment variable and ini key, default local) and the project's cluster.env."""
    from pytest_haico.config.settings import Profile
    from pytest_haico.config.values import enum_parser
    from pytest_haico.submit.inputs import submitted_identity

    submitted = submitted_identity(campaign_dir)
    if submitted is not None:
        return Profile(submitted[0]), submitted[1]
    profile = arguments.resolver(args).get("profile", enum_parser(Profile), Profile.LOCAL)
    return profile, places.site.get("BACKEND_IMAGE") if places.site else None
