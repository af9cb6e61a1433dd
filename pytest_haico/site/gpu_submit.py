"""`haico gpu-check` as a command: the check asked for (the burn's settings over the defaults,
the floor of cluster.env, the devices of an arm or a count), run here in an allocation, or
as a job whose sbatch line runs the same check on its node (`haico gpu-check --here`)."""

from __future__ import annotations

import re
import shlex
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from pytest_haico.config.cluster_site import ClusterSite
from pytest_haico.config.experiment import Arm, load_arm
from pytest_haico.errors import HaicoError
from pytest_haico.files import DEFAULT_FILE_MODE, make_dirs
from pytest_haico.site.gpu_check import FULL, BurnSettings, run_gpu_check
from pytest_haico.slurm.jobs import export_option, sbatch, sbatch_command

JOB_NAME = "haico-gpu-check"
SCRIPT = Path(__file__).parents[1] / "templates" / "gpu-check.sbatch"
_GRES_GPUS = re.compile(r"^gpu(?::[A-Za-z0-9_.-]+)?:(\d+)$")


@dataclass(frozen=True)
class GpuCheckRequest:
    """What the user asked of `haico gpu-check` (None: the default, or cluster.env's)."""

    here: bool = False
    arm: str | None = None
    gpus: int | None = None
    partition: str | None = None
    time: str = "0:30:00"
    full: bool = False
    seconds: float | None = None
    memory_fraction: float | None = None
    size: int | None = None
    min_tflops: float | None = None
    device: str = "cuda"
    log_dir: Path | None = None
    dry_run: bool = False


def run_gpu_check_command(
    site: ClusterSite,
    experiments: Path,
    request: GpuCheckRequest,
    *,
    cluster_env: Path | None,
    environ: Mapping[str, str],
    say: Callable[[str], None],
) -> int:
    """`--here`: the check of this allocation (0 passed, 1 failed); else submit its job."""
    arm = _arm(experiments, request.arm) if request.arm is not None else None
    gpus = arm_gpus(arm) if arm is not None else request.gpus
    settings = burn_settings(request, floor=site.gpu_min_tflops)
    log_dir = request.log_dir or (
        site.work / "gpu-check" if site.work else Path("gpu-check").resolve()
    )
    if request.here:
        if site.vllm_venv is None:
            raise HaicoError(f"{site.source}: VLLM_VENV is not set: the burn runs its torch")
        if gpus is None and environ.get("SLURM_GPUS_ON_NODE", "").isdigit():
            gpus = int(environ["SLURM_GPUS_ON_NODE"])
        passed = run_gpu_check(
            python=site.vllm_venv / "bin" / "python",
            expected=gpus,
            settings=settings,
            log_dir=log_dir,
            environ=environ,
            say=say,
        )
        return 0 if passed else 1
    if gpus is None:
        raise HaicoError("name the GPUs to check: --arm A or --gpus N (or --here in an allocation)")
    arm_partition = arm.slurm.partition if arm is not None and arm.slurm is not None else None
    argv = gpu_check_argv(
        gpus=gpus,
        partition=request.partition or arm_partition or site.partition,
        time_limit=request.time,
        log_dir=log_dir,
        check_args=check_args(settings, log_dir=log_dir, cluster_env=cluster_env),
    )
    if request.dry_run:
        say(f"haico gpu-check: would submit: {shlex.join(argv)}")
        return 0
    make_dirs(log_dir, DEFAULT_FILE_MODE)
    job_id = sbatch(argv)
    say(f"haico gpu-check: job {job_id} checks {gpus} GPU(s); log {log_dir}/gpu-check-{job_id}.out")
    return 0


def burn_settings(request: GpuCheckRequest, *, floor: float | None) -> BurnSettings:
    """The defaults (or `--full`'s), with what the request sets; the floor is cluster.env's
    unless the request has one."""
    base = FULL if request.full else BurnSettings()
    floor = request.min_tflops if request.min_tflops is not None else floor
    settings = replace(
        base,
        device=request.device,
        seconds=base.seconds if request.seconds is None else request.seconds,
        memory_fraction=(
            base.memory_fraction if request.memory_fraction is None else request.memory_fraction
        ),
        size=base.size if request.size is None else request.size,
        min_tflops=floor,
    )
    if not 0 <= settings.memory_fraction < 1:
        raise HaicoError(f"--memory-fraction {settings.memory_fraction:g} is not from 0 to below 1")
    return settings


def _arm(experiments: Path, name: str) -> Arm:
    path = experiments / "arms" / f"{name}.toml"
    if not path.is_file():
        raise HaicoError(f"no arm {name!r} in {path.parent}")
    return load_arm(path)


def arm_gpus(arm: Arm) -> int:
    """The GPUs an arm's job has: its `[slurm] gres` count, else tensor × data parallel."""
    gres = arm.slurm.gres if arm.slurm is not None else None
    if gres:
        match = _GRES_GPUS.match(gres)
        if match is None:
            raise HaicoError(f"arm {arm.name}: [slurm] gres={gres!r} names no GPU count (gpu:N)")
        return int(match.group(1))
    return arm.vllm.tensor_parallel_size * arm.vllm.data_parallel_size


def gpu_check_argv(
    *,
    gpus: int,
    partition: str | None,
    time_limit: str,
    log_dir: Path,
    check_args: Sequence[str],
) -> list[str]:
    """The job's sbatch line: one node with `gpus` GPUs, the allow-listed environment plus
    the interpreter, and the check's own arguments."""
    options = [
        f"--job-name={JOB_NAME}",
        "--nodes=1",
        f"--gres=gpu:{gpus}",
        f"--time={time_limit}",
        f"--output={log_dir}/gpu-check-%j.out",
        export_option({"HAICO_PYTHON": sys.executable}),
    ]
    if partition:
        options.append(f"--partition={partition}")
    return sbatch_command(options, script=SCRIPT, args=["--gpus", str(gpus), *check_args])


def check_args(settings: BurnSettings, *, log_dir: Path, cluster_env: Path | None) -> list[str]:
    """`haico gpu-check --here`'s arguments in the job, for the same check."""
    args = ["--seconds", f"{settings.seconds:g}", "--size", str(settings.size)]
    args += ["--memory-fraction", f"{settings.memory_fraction:g}", "--device", settings.device]
    args += ["--log-dir", str(log_dir)]
    if settings.min_tflops is not None:
        args += ["--min-tflops", f"{settings.min_tflops:g}"]
    if cluster_env is not None:
        args += ["--cluster-env", str(cluster_env)]
    return args
