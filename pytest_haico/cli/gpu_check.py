"""`haico gpu-check [--here] [--arm A | --gpus N] [--full] ...`: validate a node's GPUs before
a campaign is sent to them: the device count, a matmul burn with the venv's torch, a log of
each device every second, and a TFLOP/s floor. A job, or `--here` in this allocation."""

from __future__ import annotations

import argparse
import os
import shlex
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
    from dataclasses import replace

    from pytest_haico.config.cluster_site import resolve_cluster_site
    from pytest_haico.config.experiment import load_arm
    from pytest_haico.errors import HaicoError
    from pytest_haico.site.gpu_check import FULL, BurnSettings, run_gpu_check
    from pytest_haico.site.gpu_submit import (
        arm_gpus,
        check_args,
        gpu_check_argv,
        submit_gpu_check,
    )

    places = arguments.places(args)
    site = resolve_cluster_site(places.site, os.environ)
    arm = None
    if args.arm is not None:
        path = places.experiments / "arms" / f"{args.arm}.toml"
        if not path.is_file():
            raise HaicoError(f"no arm {args.arm!r} in {path.parent}")
        arm = load_arm(path)
    gpus = args.gpus if arm is None else arm_gpus(arm)
    settings = FULL if args.full else BurnSettings()
    given = {
        "seconds": args.seconds,
        "memory_fraction": args.memory_fraction,
        "size": args.size,
        "min_tflops": args.min_tflops if args.min_tflops is not None else site.gpu_min_tflops,
    }
    settings = replace(
        settings, device=args.device, **{k: v for k, v in given.items() if v is not None}
    )
    if not 0 <= settings.memory_fraction < 1:
        raise HaicoError(f"--memory-fraction {settings.memory_fraction:g} is not from 0 to below 1")
    log_dir = args.log_dir or (
        site.work / "gpu-check" if site.work else Path("gpu-check").resolve()
    )
    if args.here:
        if site.vllm_venv is None:
            raise HaicoError(f"{site.source}: VLLM_VENV is not set: the burn runs its torch")
        if gpus is None and os.environ.get("SLURM_GPUS_ON_NODE", "").isdigit():
            gpus = int(os.environ["SLURM_GPUS_ON_NODE"])
        passed = run_gpu_check(
            python=site.vllm_venv / "bin" / "python",
            expected=gpus,
            settings=settings,
            log_dir=log_dir,
            environ=os.environ,
            say=print,
        )
        return 0 if passed else 1
    if gpus is None:
        raise HaicoError("name the GPUs to check: --arm A or --gpus N (or --here in an allocation)")
    arm_partition = arm.slurm.partition if arm is not None and arm.slurm is not None else None
    argv = gpu_check_argv(
        gpus=gpus,
        partition=args.partition or arm_partition or site.partition,
        time_limit=args.time,
        log_dir=log_dir,
        check_args=check_args(settings, log_dir=log_dir, cluster_env=places.cluster_env),
    )
    if args.dry_run:
        print(f"haico gpu-check: would submit: {shlex.join(argv)}")
        return 0
    job_id = submit_gpu_check(argv, log_dir=log_dir)
    print(
        f"haico gpu-check: job {job_id} checks {gpus} GPU(s); log {log_dir}/gpu-check-{job_id}.out"
    )
    return 0
