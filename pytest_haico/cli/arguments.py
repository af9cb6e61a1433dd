"""What several `haico` commands take: the project's options, the campaign directory, and
the argument types that refuse a bad value in one line."""

from __future__ import annotations

import argparse
import os
from pathlib import Path


def add_project_options(parser: argparse.ArgumentParser) -> None:
    """--experiments, --cluster-env and --results, as pytest's --haico-* options mean them."""
    parser.add_argument(
        "--experiments", type=Path, help="where arms/ and scripts/ are (default: ./experiments)"
    )
    parser.add_argument("--cluster-env", type=Path, help="default: <experiments>/cluster.env")
    parser.add_argument(
        "--results",
        type=Path,
        help="results root (default: $CLUSTER_WORK/results, else <project>/results)",
    )


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of at least 1")
    return value


def margin(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 1 <= value < 100:
        raise argparse.ArgumentTypeError(f"{text!r} is not a factor from 1 to 100")
    return value


def campaign_dir(args: argparse.Namespace) -> Path:
    """A path names the campaign directory; a bare name is under the results root."""
    given = str(args.campaign)
    if os.sep in given or given in (".", ".."):
        return Path(given).resolve()
    return (results_root(args) / given).resolve()


def results_root(args: argparse.Namespace) -> Path:
    if args.results is not None:
        return Path(args.results).resolve()
    work = os.environ.get("CLUSTER_WORK") or _site_value(args, "CLUSTER_WORK")
    if work:
        return (Path(work) / "results").resolve()
    return (experiments(args).parent / "results").resolve()


def experiments(args: argparse.Namespace) -> Path:
    return (args.experiments or Path("experiments")).resolve()


def _site_value(args: argparse.Namespace, key: str) -> str | None:
    from pytest_haico.config.cluster_env import load_cluster_env

    path = args.cluster_env or experiments(args) / "cluster.env"
    return load_cluster_env(path).get(key) if path.is_file() else None
