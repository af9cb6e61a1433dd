"""`haico stack up <arm> | status [ARM|FILE] | down ARM|FILE`: an arm's stack kept up
between pytest runs (`pytest --haico-attach`)."""

from __future__ import annotations

import argparse

from pytest_haico.cli import arguments
from pytest_haico.config.resolution import resolve_campaign, resolve_places, resolve_results_mode


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    stack = commands.add_parser(
        "stack", help="keep an arm's stack up between pytest runs (pytest --haico-attach)"
    )
    actions = stack.add_subparsers(required=True, metavar="ACTION")
    up = actions.add_parser("up", help="start the arm's stack under a supervisor, kept up")
    up.add_argument("arm", help="the arm's name (experiments/arms/<arm>.toml)")
    up.add_argument(
        "--profile",
        choices=("local", "cluster"),
        default="local",
        help="as pytest's --haico-profile (default: local)",
    )
    up.add_argument(
        "--campaign",
        help="the services' logs and dumps go to <results>/<campaign>/<arm>/kept/ "
        "(default: $PYTEST_HAICO_CAMPAIGN, haico_campaign, else default)",
    )
    up.add_argument("--backend-cmd", help="as pytest's --haico-backend-cmd")
    up.add_argument("--backend-image", help="as pytest's --haico-backend-image (cluster profile)")
    up.add_argument(
        "--dump-interval",
        type=arguments.seconds,
        default=900.0,
        metavar="SECONDS",
        help="seconds between two pg_dumps (default: 900; 0: only the final one)",
    )
    arguments.add_project_options(up)
    up.set_defaults(run=run_up)
    status = actions.add_parser(
        "status", help="what runs, since when, on which ports, with which settings, how healthy"
    )
    status.add_argument("target", nargs="?", metavar="ARM|FILE", help="default: every kept stack")
    status.set_defaults(run=run_status)
    down = actions.add_parser("down", help="final dump, then stop every service")
    down.add_argument("target", metavar="ARM|FILE", help="the arm, or its state file")
    down.set_defaults(run=run_down)


def run_up(args: argparse.Namespace) -> int:
    from pytest_haico.config.settings import Profile
    from pytest_haico.kept.control import up

    r = arguments.resolver(args, flags={**arguments.PROJECT_FLAGS, "campaign": "--campaign"})
    places = resolve_places(r)
    campaign = resolve_campaign(r)
    return up(
        args.arm,
        experiments=places.experiments,
        profile=Profile(args.profile),
        cluster_env=places.cluster_env,
        campaign_dir=places.results / campaign,
        backend_command=args.backend_cmd,
        backend_image=args.backend_image,
        dump_interval_s=args.dump_interval,
        file_mode=resolve_results_mode(r),
        say=print,
    )


def run_status(args: argparse.Namespace) -> int:
    from pytest_haico.kept.control import status

    return status(args.target, say=print)


def run_down(args: argparse.Namespace) -> int:
    from pytest_haico.kept.control import down

    return down(args.target, say=print)
