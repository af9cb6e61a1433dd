"""The GPU gate an arm asks for (`[run] gpu_check = true`): a short `haico gpu-check` of the
job's devices before the model loads, so that a slow or faulty card costs a minute, not
the allocation."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from pytest_haico.errors import HaicoError
from pytest_haico.gates.result import GateResult, failed, passed
from pytest_haico.site.gpu_check import BurnSettings, run_gpu_check

GPU_CHECK = "gpu_check"
# Short: the gate runs in every job of the arm, before its model loads.
GATE_BURN = BurnSettings(seconds=10.0, memory_fraction=0.5, size=8192)


def check_gpus(
    environ: Mapping[str, str],
    *,
    venv: Path | None,
    expected: int,
    settings: BurnSettings,
    log_dir: Path,
) -> GateResult:
    """Gate gpu_check: `expected` devices, each through the burn, above the floor."""
    fix = (
        "resubmit away from this node (sbatch --exclude=<node>) and report it to the "
        "cluster's admins, or set [run] gpu_check = false to run without the check"
    )
    if venv is None:
        return failed(GPU_CHECK, "VLLM_VENV is not set: the burn runs its torch", fix)
    lines: list[str] = []
    try:
        ok = run_gpu_check(
            python=venv / "bin" / "python",
            expected=expected,
            settings=settings,
            log_dir=log_dir,
            environ=environ,
            say=lines.append,
        )
    except HaicoError as exc:
        return failed(GPU_CHECK, str(exc), fix)
    said = [line.removeprefix("haico gpu-check: ") for line in lines]
    if not ok:
        return failed(GPU_CHECK, "; ".join(line for line in said if "FAILED" in line), fix)
    return passed(GPU_CHECK, said[-1])
