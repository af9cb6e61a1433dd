"""`haico show <test id or item id> [--attempt N] [--campaign NAME]`: one item's
conversation, turn by turn (rendered by `report.show`)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from pytest_haico.cli import arguments
from pytest_haico.cli.output import Say
from pytest_haico.config.resolution import resolve_campaign, resolve_places


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    show = commands.add_parser(
        "show", help="one item's conversation, turn by turn: steps, tool calls, expectations"
    )
    show.add_argument("item", metavar="ID", help="the item's test id or item id")
    show.add_argument(
        "--attempt",
        type=arguments.positive_int,
        metavar="N",
        help="which attempt, from 1 in the order they finished (default: the newest)",
    )
    show.add_argument(
        "--campaign",
        help="the campaign's name under the results root, or its directory (default: "
        "$PYTEST_HAICO_CAMPAIGN, haico_campaign, else default)",
    )
    arguments.add_project_options(show)
    show.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.campaign is not None and (os.sep in args.campaign or args.campaign in (".", "..")):
        campaign = Path(args.campaign).resolve()
    else:
        r = arguments.resolver(args, flags={**arguments.PROJECT_FLAGS, "campaign": "--campaign"})
        campaign = resolve_places(r).results / resolve_campaign(r)
    colour = sys.stdout.isatty() and not os.environ.get("NO_COLOR")
    return run_show(campaign, args.item, attempt=args.attempt, colour=colour, say=print)


def run_show(campaign: Path, item: str, *, attempt: int | None, colour: bool, say: Say) -> int:
    """Print attempt `attempt` (default: the newest) of the item `item` names."""
    from pytest_haico.report.show import attempts_of, show_lines
    from pytest_haico.results import load_results

    results = load_results(campaign)
    attempts = attempts_of(results, item)
    for line in show_lines(results, attempts, attempt or len(attempts), colour=colour):
        say(line)
    return 0
