"""`haico init <dir>`: a new experiments repository that runs at once on the local profile
(what it holds: `submit.scaffold`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from pytest_haico.submit.scaffold import init


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "init", help="write a new experiments repository that runs on the local profile"
    )
    parser.add_argument("dir", type=Path, help="a new (or empty) directory")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    target = Path(args.dir)
    for path in init(target):
        print(f"haico: wrote {path}")
    print(
        f"haico: next: cd {target} && pytest experiments (the local profile: a real "
        "Postgres and the stand-ins); then, on a cluster, haico submit <campaign> --stage "
        "smoke --dry-run"
    )
    return 0
