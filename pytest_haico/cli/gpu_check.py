"""`haico gpu-check [--here] [--arm A | --gpus N] [--full] ...`: validate a node's GPUs before
a campaign is sent to them: the device count, a matmul burn with the venv's torch, a log of
each device every second, and a TFLOP/s floor. A job, or `--here` in this allocation."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from pytest_haico.cli import arguments


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    check = commands.add_parser(
        "gpu-check", help="burn and log a node's GPUs against a TFLOP/s floor, as a job"
    )
    check.add_argument(
        "--here", action="store_true", help="check this allocation's GPUs (an salloc shell)"
    )
    which = check.add_mutually_exclusive_group()
    which.add_argument("--arm", help="the GPUs (and partition) of this arm's job")
    which.add_argument("--gpus", type=arguments.positive_int, help="how many GPUs to check")
    check.add_argument(
        "--partition", help="the job's partition (default: the arm's, else PARTITION)"
    )
    check.add_argument("--time", default="0:30:00", help="the job's --time (default: 0:30:00)")
    check.add_argument(
        "--full", action="store_true", help="the seed's burn: 600 s, 75%% memory, 32768 x 32768"
    )
    check.add_argument("--seconds", type=float, help="burn time per device (default: 30)")
    check.add_argument("--memory-fraction", type=float, help="memory held (default: 0.5)")
    check.add_argument("--size", type=arguments.positive_int, help="matrix size (default: 8192)")
    check.add_argument(
        "--min-tflops", type=float, help="the floor per device (default: GPU_MIN_TFLOPS)"
    )
    check.add_argument(
        "--device", choices=("cuda", "cpu"), default="cuda", help="cpu: burn on the CPU instead"
    )
    check.add_argument("--log-dir", type=Path, help="default: $CLUSTER_WORK/gpu-check")
    check.add_argument("--dry-run", action="store_true", help="print the sbatch line only")
    arguments.add_project_options(check)
    check.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from pytest_haico.config.cluster_site import resolve_cluster_site
    from pytest_haico.site.gpu_submit import GpuCheckRequest, run_gpu_check_command

    places = arguments.places(args)
    request = GpuCheckRequest(
        here=args.here,
        arm=args.arm,
        gpus=args.gpus,
        partition=args.partition,
        time=args.time,
        full=args.full,
        seconds=args.seconds,
        memory_fraction=args.memory_fraction,
        size=args.size,
        min_tflops=args.min_tflops,
        device=args.device,
        log_dir=args.log_dir,
        dry_run=args.dry_run,
    )
    return run_gpu_check_command(
        resolve_cluster_site(places.site, os.environ),
        places.experiments,
        request,
        cluster_env=places.cluster_env,
        environ=os.environ,
        say=print,
    )
