"""What sbatch/campaign.sbatch hands pytest, without a Slurm daemon: bash runs the script
with the variables Slurm would set and a stand-in interpreter that records its argv."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
WRAPPER = REPO / "sbatch" / "campaign.sbatch"
PYTEST = ["-m", "pytest", "--haico-exit", "campaign", "-p", "no:cacheprovider"]


def run_wrapper(
    tmp_path: Path, env: dict[str, str], *args: str
) -> subprocess.CompletedProcess[str]:
    """Run the script with bash outside any job, `env` added; HAICO_PYTHON writes its
    arguments, one per line, to tmp_path/argv."""
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > "{tmp_path}/argv"\n')
    python.chmod(0o755)
    clean = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SLURM_", "HAICO_", "SBATCH_", "PYTEST_HAICO_"))
    }
    return subprocess.run(
        ["bash", str(WRAPPER), *args],
        env={**clean, "HAICO_PYTHON": str(python), **env},
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )


def argv(tmp_path: Path) -> list[str]:
    return (tmp_path / "argv").read_text().splitlines()


def array_task(task: int, count: int) -> dict[str, str]:
    return {
        "SLURM_JOB_ID": "501",
        "SLURM_ARRAY_JOB_ID": "500",
        "SLURM_ARRAY_TASK_ID": str(task),
        "SLURM_ARRAY_TASK_COUNT": str(count),
    }


def test_an_array_task_passes_its_shard_of_the_array(tmp_path: Path) -> None:
    done = run_wrapper(tmp_path, array_task(1, 3), "experiments", "--haico-arm", "demo")
    assert done.returncode == 0, done.stderr
    assert argv(tmp_path) == [*PYTEST, "--haico-shard", "1/3", "experiments", "--haico-arm", "demo"]


def test_haico_shard_count_is_the_count_of_an_array_of_some_shards(tmp_path: Path) -> None:
    # `--array=1,3`: tasks 1 and 3 of four shards, in an array of two tasks.
    done = run_wrapper(tmp_path, {**array_task(3, 2), "HAICO_SHARD_COUNT": "4"}, "experiments")
    assert done.returncode == 0, done.stderr
    assert argv(tmp_path) == [*PYTEST, "--haico-shard", "3/4", "experiments"]


def test_outside_an_array_no_shard_is_passed(tmp_path: Path) -> None:
    done = run_wrapper(tmp_path, {"SLURM_JOB_ID": "7", "HAICO_SHARD_COUNT": "4"}, "experiments")
    assert done.returncode == 0, done.stderr
    assert argv(tmp_path) == [*PYTEST, "experiments"]


@pytest.mark.parametrize("value", ["four", "0", "-1", "2/4", " 4"])
def test_a_shard_count_that_is_no_number_is_a_usage_error(tmp_path: Path, value: str) -> None:
    done = run_wrapper(tmp_path, {**array_task(1, 2), "HAICO_SHARD_COUNT": value}, "experiments")
    assert done.returncode == 4
    assert done.stderr == (
        f"haico: HAICO_SHARD_COUNT={value} is not a number of shards (1, 2, ...)\n"
    )
    assert not (tmp_path / "argv").exists(), "pytest started"


def test_the_usr1_trap_is_the_first_command() -> None:
    commands = [
        line
        for line in WRAPPER.read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    assert commands[0].startswith("trap 'usr1=1;") and commands[0].endswith("USR1")
