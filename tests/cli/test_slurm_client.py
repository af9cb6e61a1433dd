"""Reading Slurm's answers where the test cluster cannot give them (accounting on, a site's
completion log), with recording stand-ins for the client commands on PATH."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from pytest_haico.slurm import client as slurm


def _bin(tmp_path: Path, **scripts: str) -> dict[str, str]:
    """An environment whose PATH holds only these commands (bash scripts)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, body in scripts.items():
        path = bin_dir / name
        path.write_text(f'#!/bin/bash\nprintf "%s\\n" "$@" > {tmp_path}/{name}.argv\n{body}\n')
        path.chmod(0o755)
    return {"PATH": str(bin_dir), "TZ": "America/New_York"}


def test_a_finished_job_is_found_by_name_in_accounting_since_its_submission(
    tmp_path: Path,
) -> None:
    env = _bin(
        tmp_path,
        squeue="exit 0",
        sacct="echo 77_0; echo 77_1",
    )
    since = (datetime.now(UTC) - timedelta(minutes=5)).strftime("%Y-%m-%dT%H:%M:%SZ")
    found = slurm.find_job("haico.c.x.smoke.a.s", since=since, environ=env)
    assert found == "77"
    argv = (tmp_path / "sacct.argv").read_text().splitlines()
    # Relative to now, whatever sacct's time zone: five minutes ago and one for skew.
    assert argv[argv.index("-S") + 1] in ("now-6minutes", "now-7minutes")
    assert argv[argv.index("--name") + 1] == "haico.c.x.smoke.a.s"


def test_two_jobs_of_one_name_are_an_error_that_says_what_to_do(tmp_path: Path) -> None:
    env = _bin(tmp_path, squeue="echo 12; echo 15")
    with pytest.raises(slurm.SlurmError, match=r"2 jobs are named n \(12, 15\): cancel"):
        slurm.find_job("n", since="2026-12-01T10:00:00Z", environ=env)


def test_without_accounting_the_completion_log_names_the_job_and_its_tasks_ends(
    tmp_path: Path,
) -> None:
    log = tmp_path / "jobcomp.txt"
    log.write_text(
        "JobId=41 UserId=u(1) Name=other JobState=COMPLETED ExitCode=0:0\n"
        "JobId=43 UserId=u(1) Name=haico.n JobState=TIMEOUT Partition=debug ExitCode=0:0 "
        "ArrayJobId=42 ArrayTaskId=1\n"
        "JobId=42 UserId=u(1) Name=haico.n JobState=FAILED Partition=debug ExitCode=75:0 "
        "ArrayJobId=42 ArrayTaskId=0\n"
    )
    env = _bin(
        tmp_path,
        squeue="exit 0",
        sacct='echo "sacct: error: Slurm accounting storage is disabled" >&2; exit 1',
        scontrol=(
            "if [[ $1 == show && $2 == config ]]; then\n"
            f"  echo 'JobCompLoc              = {log}'\n"
            "  echo 'JobCompType             = jobcomp/filetxt'\n"
            "else exit 1; fi"
        ),
    )
    assert slurm.find_job("haico.n", since="2026-12-01T10:00:00Z", environ=env) == "42"
    assert slurm.task_states("42", environ=env) == {0: "FAILED 75:0", 1: "TIMEOUT 0:0"}


def test_the_controller_and_accounting_give_each_tasks_state_the_controller_first(
    tmp_path: Path,
) -> None:
    env = _bin(
        tmp_path,
        scontrol=(
            "echo 'JobId=9 ArrayJobId=9 ArrayTaskId=2 JobState=RUNNING ExitCode=0:0'\n"
            "echo 'JobId=9 ArrayJobId=9 ArrayTaskId=3-4 JobState=PENDING ExitCode=0:0'"
        ),
        sacct=(
            "echo '9_0|COMPLETED|0:0'; echo '9_1|CANCELLED by 1000|0:15'; echo '9_2|PENDING|0:0'"
        ),
    )
    assert slurm.task_states("9", environ=env) == {
        0: "COMPLETED 0:0",
        1: "CANCELLED 0:15",
        2: "RUNNING 0:0",
        3: "PENDING 0:0",
        4: "PENDING 0:0",
    }


def test_a_missing_command_names_itself_and_the_fix(tmp_path: Path) -> None:
    with pytest.raises(slurm.SlurmError, match="squeue is not on PATH"):
        slurm.find_job("n", since="2026-12-01T10:00:00Z", environ={"PATH": str(tmp_path)})
