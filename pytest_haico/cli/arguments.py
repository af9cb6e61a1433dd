"""What several `haico` commands take: the project's options (resolved as pytest resolves
them), the campaign directory, and the argument types that refuse a bad value in one line."""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable, Mapping
from pathlib import Path

from pytest_haico.config.project import project_resolver
from pytest_haico.config.resolution import Places, Resolver, resolve_campaign, resolve_places
from pytest_haico.errors import ConfigError

# The project options' flags, by the noun of the pytest option each stands for.
PROJECT_FLAGS = {
    "experiments": "--experiments",
    "cluster_env": "--cluster-env",
    "results": "--results",
}


def add_project_options(parser: argparse.ArgumentParser) -> None:
    """--experiments, --cluster-env and --results: pytest's --haico-* options, with their
    environment variables, ini keys and defaults."""
    parser.add_argument(
        "--experiments",
        type=Path,
        help="where arms/ and scripts/ are (default: $PYTEST_HAICO_EXPERIMENTS, "
        "haico_experiments, else <rootdir>/experiments)",
    )
    parser.add_argument(
        "--cluster-env",
        type=Path,
        help="default: $PYTEST_HAICO_CLUSTER_ENV, haico_cluster_env, else "
        "<experiments>/cluster.env",
    )
    parser.add_argument(
        "--results",
        type=Path,
        help="results root (default: $PYTEST_HAICO_RESULTS, haico_results, else "
        "$CLUSTER_WORK/results, else <rootdir>/results)",
    )


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of at least 1")
    return value


def bounded_int(maximum: int) -> Callable[[str], int]:
    """A whole number from 1 to `maximum`."""

    def parse(text: str) -> int:
        value = positive_int(text)
        if value > maximum:
            raise argparse.ArgumentTypeError(f"{text!r} is more than {maximum}, the bound")
        return value

    return parse


def seconds(text: str) -> float:
    """A finite number of seconds >= 0."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < math.inf:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds >= 0")
    return value


def number_between(low: float, high: float, what: str) -> Callable[[str], float]:
    """A number from `low` to `high`; `what` names it in the refusal ("a factor")."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what} from {low:g} to {high:g}")
        return value

    return parse


margin = number_between(1, 100, "a factor")


def resolver(args: argparse.Namespace, *, flags: Mapping[str, str] = PROJECT_FLAGS) -> Resolver:
    """The settings resolver of this command: `flags` (noun -> flag) are the command-line
    values, then the environment and the project's pytest configuration, as for pytest."""
    given = {noun: getattr(args, noun, None) for noun in flags}
    cli = {noun: (value, flags[noun]) for noun, value in given.items() if value is not None}
    return project_resolver(cli, environ=os.environ)


def places(args: argparse.Namespace) -> Places:
    """The experiments, the cluster.env and the results root, as pytest resolves them."""
    return resolve_places(resolver(args))


def add_campaign_argument(parser: argparse.ArgumentParser) -> None:
    """The optional campaign positional of the commands that read one campaign's results."""
    parser.add_argument(
        "campaign",
        nargs="?",
        help="the campaign directory, <results>/<campaign>, or its name under the results root "
        "(default: $PYTEST_HAICO_CAMPAIGN, haico_campaign, else default)",
    )


def campaign_dir(args: argparse.Namespace, found: Places | None = None) -> Path:
    """A path names the campaign directory; a bare name is under the results root (of
    `found`, else of this command's places); none is the campaign pytest would write."""
    given = resolve_campaign(resolver(args)) if args.campaign is None else str(args.campaign)
    if not given.strip():
        raise ConfigError(
            "campaign", "", "empty; give the campaign's name, or its directory <results>/<name>"
        )
    if os.sep in given or given in (".", ".."):
        return Path(given).resolve()
    return ((found or places(args)).results / given).resolve()


def results_operand(args: argparse.Namespace, operand: str) -> str:
    """A results path as given (`DIR`, `DIR@RUN`), or, where `DIR` is not there from the
    working directory but is under the results root (`<campaign>/<arm>`), that one."""
    path, at, run = operand.rpartition("@")
    if not (at and path and run and "/" not in run):
        path, at, run = operand, "", ""
    if not path or Path(path).exists():
        return operand
    under = places(args).results / path
    return f"{under}{at}{run}" if under.exists() else operand


def share(low: float, high: float, *, closed: bool = True) -> Callable[[str], float]:
    """A number from `low` to `high` (`high` excluded unless `closed`)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (low <= value <= high) or (not closed and value == high):
            bound = "to" if closed else "up to, not including,"
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a number from {low:g} {bound} {high:g} (a share: 0.02 is 2 "
                "points)"
            )
        return value

    return parse


def add_gate_options(parser: argparse.ArgumentParser) -> None:
    """The paired comparison's options: the interval gate, its confidence, the pass rule."""
    parser.add_argument(
        "--max-drop",
        type=share(0.0, 1.0),
        metavar="SHARE",
        help="exit 1 when B's pass rate is lower than A's by more than SHARE (0.02: 2 points) "
        "at --confidence: the whole interval of the paired difference B − A lies below "
        "−SHARE; a drop the interval does not show passes",
    )
    parser.add_argument(
        "--confidence",
        type=share(0.5, 1.0, closed=False),
        default=0.95,
        metavar="C",
        help="of every interval and of the gate (default 0.95)",
    )
    parser.add_argument(
        "--pass-rule",
        metavar="RULE",
        help="all, any, majority or k_of_n:K/N: how a script's repeats make one verdict for "
        "the pass rates and the gate (default: the arm's [run] pass_rule the runs recorded, "
        "else each repeat on its own)",
    )
