"""`haico validate --baseline CMD|COMMIT --candidate CMD|COMMIT [--arm A] [-- PYTEST ARGS]`:
both backend builds on one model, then compared (the work: `pytest_haico.validate`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from pytest_haico.cli import arguments


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    v = commands.add_parser("validate", help="run a baseline and a candidate backend, compare")
    v.add_argument(
        "--baseline", required=True, metavar="CMD|COMMIT", help="the build compared with"
    )
    v.add_argument("--candidate", required=True, metavar="CMD|COMMIT", help="the build checked")
    v.add_argument("--backend-cmd", metavar="CMD", help="a COMMIT's command, run in its checkout")
    v.add_argument("--backend-repo", type=Path, default=Path(), metavar="DIR", help="default: .")
    v.add_argument("--arm", help="the arm whose items run (default: the only one)")
    v.add_argument("--attach", metavar="ARM|FILE", help="the model of this kept stack")
    v.add_argument("--campaign", help="default: validate-<UTC time>, a new campaign")
    v.add_argument("--profile", choices=("local", "cluster"), help="as pytest's --haico-profile")
    arguments.add_gate_options(v)
    arguments.add_project_options(v)
    v.add_argument("pytest_args", nargs="*", metavar="-- PYTEST ARGS", help="e.g. -- -k greet")
    v.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from pytest_haico.report.paired import Gate
    from pytest_haico.validate.session import Request, validate

    flags = {**arguments.PROJECT_FLAGS, "profile": "--profile", "backend_cmd": "--backend-cmd"}
    request = Request(
        args.baseline,
        args.candidate,
        backend_repo=args.backend_repo,
        arm=args.arm,
        campaign=args.campaign,
        attach=args.attach,
        pytest_args=tuple(args.pytest_args),
        resolver=arguments.resolver(args, flags=flags),
        gate=Gate(args.max_drop, args.confidence) if args.max_drop is not None else None,
        pass_rule=args.pass_rule,
        confidence=args.confidence,
    )
    return validate(request, say=lambda line: print(line, flush=True))
