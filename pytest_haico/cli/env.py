"""`haico env [--venv-only | --images-only] [--arm A] [--time T] [--dry-run]`: build the
pinned vLLM venv and pull the images' SIFs, as a job on the CPU partition."""

from __future__ import annotations

import argparse
import os

from pytest_haico.cli import arguments


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    env = commands.add_parser(
        "env",
        help="build VLLM_VENV from VLLM_REQUIREMENTS and pull the images into SIF_DIR, "
        "as a job on CPU_PARTITION (cluster.env); nothing when all is in place",
    )
    only = env.add_mutually_exclusive_group()
    only.add_argument("--venv-only", action="store_true", help="the venv, not the images")
    only.add_argument("--images-only", action="store_true", help="the images, not the venv")
    env.add_argument(
        "--arm",
        action="append",
        default=[],
        help="pull the images of this arm (repeatable; default: every arm)",
    )
    env.add_argument("--time", default="1:00:00", help="the job's --time (default: 1:00:00)")
    env.add_argument("--dry-run", action="store_true", help="print the sbatch line, submit nothing")
    arguments.add_project_options(env)
    env.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from pytest_haico.config.cluster_site import resolve_cluster_site
    from pytest_haico.site.env import EnvRequest, run_env

    places = arguments.places(args)
    request = EnvRequest(
        venv=not args.images_only,
        images=not args.venv_only,
        arms=tuple(args.arm),
        time=args.time,
        dry_run=args.dry_run,
    )
    site = resolve_cluster_site(places.site, os.environ)
    return run_env(site, places.experiments, request, environ=os.environ, say=print)
