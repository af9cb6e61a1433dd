"""`haico gpu-check` as a job: the devices it asks for (an arm's, or a count), and its sbatch
line, which runs the check on the job's node (`haico gpu-check --here`)."""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from pathlib import Path

from pytest_haico.config.experiment import Arm
from pytest_haico.errors import HaicoError
from pytest_haico.files import DEFAULT_FILE_MODE, make_dirs
from pytest_haico.site.gpu_check import BurnSettings
from pytest_haico.slurm.jobs import sbatch

JOB_NAME = "haico-gpu-check"
SCRIPT = Path(__file__).parents[1] / "templates" / "gpu-check.sbatch"
_GRES_GPUS = re.compile(r"^gpu(?::[A-Za-z0-9_.-]+)?:(\d+)$")


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
    if "," in sys.executable:
        raise HaicoError(f"{sys.executable} has a comma, which sbatch --export cannot pass")
    argv = [
        "sbatch",
        "--parsable",
        f"--job-name={JOB_NAME}",
        "--nodes=1",
        f"--gres=gpu:{gpus}",
        f"--time={time_limit}",
        f"--output={log_dir}/gpu-check-%j.out",
        f"--export=ALL,HAICO_PYTHON={sys.executable}",
    ]
    if partition:
        argv.append(f"--partition={partition}")
    return [*argv, str(SCRIPT), "--gpus", str(gpus), *check_args]


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


def submit_gpu_check(argv: Sequence[str], *, log_dir: Path) -> str:
    """Submit the job (its log directory made first); its id."""
    make_dirs(log_dir, DEFAULT_FILE_MODE)
    return sbatch(argv)
