"""`haico gpu-check`: through the `nvidia-smi` shim and a CPU matmul (numpy in this venv, as
the burn uses where torch is absent): healthy cards pass with a per-second log per node; a
card too slow, a card missing from the allocation or from the bus, and ECC errors fail; the
job's sbatch line asks for the GPUs; bad input is one line and exit 2."""

from __future__ import annotations

import csv
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from pytest_haico.cli.main import main
from pytest_haico.site.gpu_check import QUERY
from tests.site.env_site import REPO, SHIMS

GPUS = [
    {"index": 0, "uuid": "GPU-0000aaaa", "utilization": 98, "power": 301.5, "temperature": 64,
     "ecc": 0},
    {"index": 1, "uuid": "GPU-1111bbbb", "utilization": 97, "power": 298.0, "temperature": 66,
     "ecc": 0},
]  # fmt: skip
# A second of burn on tiny matrices: the CPU's TFLOP/s is far below any card's, far above 0.
QUICK = ["--here", "--device", "cpu", "--seconds", "1", "--size", "64"]


class Node:
    """A scratch node: the nvidia-smi shim, a venv whose python has numpy, cluster.env."""

    def __init__(self, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.root = root
        self.bin = root / "bin"
        self.bin.mkdir()
        shutil.copy2(SHIMS / "nvidia-smi", self.bin / "nvidia-smi")
        (self.bin / "python3").symlink_to(sys.executable)  # the shim's interpreter
        venv = root / "venv"
        (venv / "bin").mkdir(parents=True)
        (venv / "bin" / "python").symlink_to(sys.executable)
        self.logs = root / "work" / "gpu-check"
        self.experiments = root / "experiments"
        (self.experiments / "arms").mkdir(parents=True)
        shutil.copy(REPO / "experiments" / "arms" / "demo.toml", self.experiments / "arms")
        (self.experiments / "cluster.env").write_text(
            f"CLUSTER_WORK={root / 'work'}\nVLLM_VENV={venv}\nPARTITION=gpu\n"
        )
        self.gpus(GPUS)
        monkeypatch.setenv("PATH", f"{self.bin}:{Path(sys.executable).parent}:/usr/bin:/bin")
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
        monkeypatch.delenv("SLURM_GPUS_ON_NODE", raising=False)
        monkeypatch.chdir(root)

    def gpus(self, gpus: list[dict[str, Any]]) -> None:
        (self.bin / "nvidia-smi.json").write_text(json.dumps({"gpus": gpus}))

    def check(self, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, list[str], str]:
        status = main(["gpu-check", "--experiments", str(self.experiments), *args])
        out, err = capsys.readouterr()
        return status, out.splitlines(), err

    def samples(self) -> list[dict[str, str]]:
        [log] = self.logs.glob("gpu-*.csv")
        with log.open() as lines:
            return list(csv.DictReader(lines, skipinitialspace=True))


@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Node:
    return Node(tmp_path, monkeypatch)


def test_healthy_cards_pass_and_each_is_logged_every_second_into_a_file_per_node(
    node: Node, capsys: pytest.CaptureFixture[str]
) -> None:
    status, lines, err = node.check(capsys, *QUICK, "--min-tflops", "1e-9", "--gpus", "2")
    assert (status, err) == (0, "")
    assert len(lines) == 3
    for line, gpu in zip(lines, GPUS, strict=False):
        assert f" device {gpu['index']}: " in line and " TFLOP/s (floor 1e-09), " in line
        assert line.endswith(f"(max {gpu['temperature']} C, {gpu['power']:g} W, ECC 0); ok")
    assert lines[2].endswith(
        f"2 of 2 device(s) passed; samples every second in {next(node.logs.glob('gpu-*.csv'))}"
    )
    samples = node.samples()
    assert {row["index"] for row in samples} == {"0", "1"}
    assert list(samples[0]) == [
        "index", "uuid", "utilization.gpu [%]", "power.draw [W]", "temperature.gpu",
        "ecc.errors.uncorrected.volatile.total",
    ]  # fmt: skip
    calls = (node.bin / "nvidia-smi-calls.jsonl").read_text()
    [call] = [json.loads(line) for line in calls.splitlines()]
    assert call == [f"--query-gpu={QUERY}", "--format=csv", "-lms", "1000"]


def test_a_card_slower_than_the_floor_fails(node: Node, capsys: pytest.CaptureFixture[str]) -> None:
    status, lines, _ = node.check(capsys, *QUICK, "--min-tflops", "1000000")
    assert status == 1
    for line in lines[:2]:
        assert " TFLOP/s is below the floor of 1e+06" in line and "; FAILED: " in line
    assert " 0 of 2 device(s) passed" in lines[2]


def test_a_card_missing_from_the_allocation_fails_before_any_burn(
    node: Node, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    monkeypatch.setenv("SLURM_GPUS_ON_NODE", "2")
    status, [line], _ = node.check(capsys, *QUICK)
    assert status == 1
    assert line.endswith(
        ": 1 device(s) visible (CUDA_VISIBLE_DEVICES='0'), the allocation has 2: a card is "
        "missing or the job asked for another count; FAILED"
    )
    assert not (node.bin / "nvidia-smi-calls.jsonl").exists()


def test_a_card_nvidia_smi_no_longer_sees_and_one_with_ecc_errors_fail(
    node: Node, capsys: pytest.CaptureFixture[str]
) -> None:
    node.gpus([{**GPUS[0], "ecc": 3}])  # device 1 fell off the bus
    status, lines, _ = node.check(capsys, *QUICK)
    assert status == 1
    assert lines[0].endswith("ECC 3); FAILED: 3 uncorrected ECC error(s)")
    assert lines[1].endswith(
        "0 samples; FAILED: nvidia-smi logged no sample of device 1: is it on the bus?"
    )


def test_a_burn_that_cannot_use_its_device_names_the_burns_own_error(
    node: Node, capsys: pytest.CaptureFixture[str]
) -> None:
    # numpy (this venv has no torch) cannot burn a CUDA device: the burn says so in its line.
    status, lines, _ = node.check(capsys, "--here", "--device", "cuda", "--seconds", "1")
    assert status == 1
    assert lines[0].endswith(
        "ECC 0); FAILED: the burn on device 0 failed (exit 1): "
        "RuntimeError: torch is not importable, and numpy cannot use cuda:0"
    )


def test_a_burn_that_dies_before_it_can_say_is_named_by_its_exception_not_the_last_line(
    node: Node, capsys: pytest.CaptureFixture[str]
) -> None:
    # What torch printed on an H200 node for a CUDA_VISIBLE_DEVICES entry it does not have.
    python = node.root / "venv" / "bin" / "python"
    python.unlink()
    python.write_text(
        "#!/bin/sh\ncat >&2 <<'EOF'\nTraceback (most recent call last):\n"
        '  File "gpu_burn.py", line 28, in _burn_torch\n'
        "torch.AcceleratorError: CUDA error: invalid device ordinal\n"
        "GPU device may be out of range, do you have enough GPUs?\n"
        "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n\nEOF\nexit 1\n"
    )
    python.chmod(0o755)
    status, lines, _ = node.check(capsys, *QUICK)
    assert status == 1
    assert lines[1].endswith(
        "FAILED: the burn on device 1 failed (exit 1): "
        "torch.AcceleratorError: CUDA error: invalid device ordinal"
    )


def test_the_job_asks_for_the_arms_gpus_and_runs_the_same_check_on_its_node(
    node: Node, capsys: pytest.CaptureFixture[str]
) -> None:
    status, [line], _ = node.check(capsys, "--arm", "demo", "--full", "--dry-run")
    assert status == 0
    assert line.startswith(
        "haico gpu-check: would submit: sbatch --parsable --job-name=haico-gpu-check "
        "--nodes=1 --gres=gpu:1 --time=0:30:00 "
        f"--output={node.logs}/gpu-check-%j.out --export=ALL,HAICO_PYTHON="
    )
    assert line.endswith(
        "--partition=gpu "
        f"{REPO}/pytest_haico/templates/gpu-check.sbatch --gpus 1 --seconds 600 --size 32768 "
        f"--memory-fraction 0.75 --device cuda --log-dir {node.logs} "
        f"--cluster-env {node.experiments / 'cluster.env'}"
    )


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--memory-fraction", "1.5"], "haico: --memory-fraction 1.5 is not from 0 to below 1"),
        (["--arm", "qwen"], "haico: no arm 'qwen' in {arms}"),
        ([], "haico: name the GPUs to check: --arm A or --gpus N (or --here in an allocation)"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    node: Node, capsys: pytest.CaptureFixture[str], args: list[str], says: str
) -> None:
    status, lines, err = node.check(capsys, *args)
    assert (status, lines, err) == (2, [], says.format(arms=node.experiments / "arms") + "\n")


def test_a_floor_in_cluster_env_that_is_no_number_is_one_line(
    node: Node, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster_env = node.experiments / "cluster.env"
    cluster_env.write_text(cluster_env.read_text() + "GPU_MIN_TFLOPS=fast\n")
    status, lines, err = node.check(capsys, *QUICK)
    assert (status, lines) == (2, [])
    assert err == f"haico: {cluster_env}: GPU_MIN_TFLOPS: 'fast' is not a positive number\n"


def test_the_log_is_named_by_the_utc_time_whatever_the_nodes_time_zone(
    node: Node, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TZ", "Asia/Tokyo")  # 9 hours ahead, no summer time
    time.tzset()
    try:
        before = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        status, _, err = node.check(capsys, *QUICK, "--min-tflops", "1e-9", "--gpus", "2")
        after = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    finally:
        monkeypatch.undo()
        time.tzset()
    assert (status, err) == (0, "")
    [log] = node.logs.glob("gpu-*.csv")
    stamp = log.name.removesuffix(".csv").rsplit("-", 1)[1]
    assert before <= stamp <= after, log.name
