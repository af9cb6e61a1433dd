"""What sbatch/campaign.sbatch hands pytest, without a Slurm daemon: bash runs the script
with the variables Slurm would set and a stand-in interpreter that records its argv."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
WRAPPER = REPO / "sbatch" / "campaign.sbatch"
PYTEST = ["-m", "pytest", "--haico-exit=campaign", "-p", "no:cacheprovider"]


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


@pytest.mark.subprocess
def test_an_array_task_passes_its_shard_of_the_array(tmp_path: Path) -> None:
    done = run_wrapper(tmp_path, array_task(1, 3), "experiments", "--haico-arm", "demo")
    assert done.returncode == 0, done.stderr
    assert argv(tmp_path) == [*PYTEST, "--haico-shard=1/3", "experiments", "--haico-arm", "demo"]


@pytest.mark.subprocess
def test_haico_shard_count_is_the_count_of_an_array_of_some_shards(tmp_path: Path) -> None:
    # `--array=1,3`: tasks 1 and 3 of four shards, in an array of two tasks.
    done = run_wrapper(tmp_path, {**array_task(3, 2), "HAICO_SHARD_COUNT": "4"}, "experiments")
    assert done.returncode == 0, done.stderr
    assert argv(tmp_path) == [*PYTEST, "--haico-shard=3/4", "experiments"]


@pytest.mark.subprocess
def test_outside_an_array_no_shard_is_passed(tmp_path: Path) -> None:
    done = run_wrapper(tmp_path, {"SLURM_JOB_ID": "7", "HAICO_SHARD_COUNT": "4"}, "experiments")
    assert done.returncode == 0, done.stderr
    assert argv(tmp_path) == [*PYTEST, "experiments"]


@pytest.mark.subprocess
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


def exiting_interpreter(tmp_path: Path, how: str) -> dict[str, str]:
    """HAICO_PYTHON for a pytest that ends by `how` (a shell command), the real interpreter
    for anything else the script runs."""
    python = tmp_path / "exiting-python"
    python.write_text(
        f'#!/bin/bash\n[[ $2 == pytest ]] && {{ {how}; }}\nexec "{sys.executable}" "$@"\n'
    )
    python.chmod(0o755)
    return {"HAICO_PYTHON": str(python)}


@pytest.mark.subprocess
@pytest.mark.parametrize("signal_name", ["KILL", "TERM", "USR1"])
def test_a_pytest_killed_before_it_chose_its_items_ends_the_job_75(
    tmp_path: Path, signal_name: str
) -> None:
    done = run_wrapper(tmp_path, exiting_interpreter(tmp_path, f"kill -{signal_name} $$"))
    status = 128 + signal.Signals[f"SIG{signal_name}"]
    assert done.returncode == 75
    assert done.stderr.endswith(
        f"haico: pytest was killed by SIG{signal_name} (exit {status}) "
        "before it had chosen its items: nothing of this run is recorded; exit 75, resubmit to "
        "continue\n"
    ), done.stderr


@pytest.mark.subprocess
@pytest.mark.parametrize("code", [1, 2, 3, 5, 127])
def test_an_exit_code_outside_campaign_modes_ends_the_job_4(tmp_path: Path, code: int) -> None:
    done = run_wrapper(tmp_path, exiting_interpreter(tmp_path, f"exit {code}"))
    assert done.returncode == 4
    assert done.stderr == (
        f"haico: pytest ended with exit {code}, none of campaign mode's codes (a crash or a "
        "broken environment: its log above says which): exit 4\n"
    )


@pytest.mark.subprocess
@pytest.mark.parametrize("code", [0, 4, 75, 78])
def test_campaign_modes_codes_are_the_jobs(tmp_path: Path, code: int) -> None:
    done = run_wrapper(tmp_path, exiting_interpreter(tmp_path, f"exit {code}"))
    assert (done.returncode, done.stderr) == (code, "")


@pytest.mark.subprocess
def test_no_run_items_file_is_left_behind(tmp_path: Path) -> None:
    temp = tmp_path / "tmp"
    temp.mkdir()
    done = run_wrapper(
        tmp_path, {**exiting_interpreter(tmp_path, "kill -9 $$"), "TMPDIR": str(temp)}
    )
    assert done.returncode == 75
    assert list(temp.iterdir()) == []


@pytest.mark.subprocess
def test_a_killed_runs_partial_dump_is_removed_and_its_complete_dumps_kept(
    tmp_path: Path,
) -> None:
    arm = tmp_path / "results" / "default" / "demo"
    (arm / "ledger").mkdir(parents=True)
    dumps = arm / "runs" / "500_1.1" / "dumps"
    dumps.mkdir(parents=True)
    partial = dumps / ".final-20261202T000000Z.dump.partial"
    partial.touch()
    complete = dumps / "periodic-20261201T235000Z.dump"
    complete.touch()
    items = f'{{"ledgers": [{{"path": "{arm}/ledger/500_1.1.jsonl", "items": ["s1"]}}]}}'
    kill = f"printf '%s' '{items}' > \"$HAICO_RUN_ITEMS\"; kill -9 $$"
    done = run_wrapper(tmp_path, exiting_interpreter(tmp_path, kill))
    assert done.returncode == 75, done.stderr
    assert f"haico: removed {partial}: a dump the killed run never completed\n" in done.stderr
    assert list(dumps.iterdir()) == [complete]
