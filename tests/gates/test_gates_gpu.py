"""Gate gpu_check (an arm's `[run] gpu_check = true`): the short GPU check as a gate, through
the `nvidia-smi` shim and a CPU burn: healthy cards pass, a slow card and a missing one fail
with the node's lines and what to do."""

from __future__ import annotations

import json
import shutil
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from pytest_haico.gates.gpu import GPU_CHECK, check_gpus
from pytest_haico.gates.result import GateResult
from pytest_haico.site.gpu_check import BurnSettings

SHIMS = Path(__file__).parents[1] / "cluster" / "shims"
GPU = {"utilization": 99, "power": 300.0, "temperature": 60, "ecc": 0}
CPU_BURN = BurnSettings(seconds=1.0, size=64, device="cpu")


@pytest.fixture
def environ(tmp_path: Path) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shutil.copy2(SHIMS / "nvidia-smi", bin_dir / "nvidia-smi")
    (bin_dir / "python3").symlink_to(sys.executable)
    gpus = [{"index": i, "uuid": f"GPU-{i}", **GPU} for i in range(2)]
    (bin_dir / "nvidia-smi.json").write_text(json.dumps({"gpus": gpus}))
    (tmp_path / "venv" / "bin").mkdir(parents=True)
    (tmp_path / "venv" / "bin" / "python").symlink_to(sys.executable)
    return {"PATH": f"{bin_dir}:/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": "0,1"}


def _gate(
    tmp_path: Path, environ: dict[str, str], *, expected: int = 2, floor: float = 1e-9
) -> GateResult:
    return check_gpus(
        environ,
        venv=tmp_path / "venv",
        expected=expected,
        settings=replace(CPU_BURN, min_tflops=floor),
        log_dir=tmp_path / "logs",
    )


def test_healthy_cards_pass_the_gate_with_the_log_named(
    tmp_path: Path, environ: dict[str, str]
) -> None:
    result = _gate(tmp_path, environ)
    assert (result.name, result.passed) == (GPU_CHECK, True)
    [log] = (tmp_path / "logs").glob("gpu-*.csv")
    assert result.detail.endswith(f": 2 of 2 device(s) passed; samples every second in {log}")


def test_a_slow_card_fails_the_gate_naming_it_and_the_fix(
    tmp_path: Path, environ: dict[str, str]
) -> None:
    result = _gate(tmp_path, environ, floor=1e6)
    assert not result.passed
    assert result.detail.count("is below the floor of 1e+06") == 2
    assert result.fix.startswith("resubmit away from this node (sbatch --exclude=<node>)")


def test_a_missing_card_fails_the_gate(tmp_path: Path, environ: dict[str, str]) -> None:
    result = _gate(tmp_path, environ, expected=4)
    assert not result.passed
    assert "2 device(s) visible (CUDA_VISIBLE_DEVICES='0,1'), the allocation has 4" in result.detail
