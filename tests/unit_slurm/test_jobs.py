"""Slurm's jobs where the test cluster cannot show them (accounting on, a site's completion
log, an end time Slurm cannot give), with recording stand-ins for the commands on PATH."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from pytest_haico.slurm import jobs as slurm
from pytest_haico.slurm.client import SlurmError
from pytest_haico.slurm.records import TaskState
from tests.unit_slurm.commands import stand_ins


def test_a_finished_job_is_found_by_name_in_accounting_since_its_submission(
    tmp_path: Path,
) -> None:
    env = stand_ins(
        tmp_path,
        squeue="exit 0",
        sacct="echo 77_0; echo 77_1",
    )
    since = (datetime.now(UTC) - timedelta(minutes=5)).strftime("%Y-%m-%dT%H:%M:%SZ")
    found = slurm.find_job("haico.c.x.smoke.a.s", since=since, environ=env)
    assert found == slurm.NameLookup("77", history=True)
    argv = (tmp_path / "sacct.argv").read_text().splitlines()
    # Relative to now, whatever sacct's time zone: five minutes ago and one for skew.
    assert argv[argv.index("-S") + 1] in ("now-6minutes", "now-7minutes")
    assert argv[argv.index("--name") + 1] == "haico.c.x.smoke.a.s"


def test_two_jobs_of_one_name_are_an_error_that_says_what_to_do(tmp_path: Path) -> None:
    env = stand_ins(tmp_path, squeue="echo 12; echo 15")
    with pytest.raises(SlurmError, match=r"2 jobs are named n \(12, 15\): cancel"):
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
    env = stand_ins(
        tmp_path,
        squeue="exit 0",
        sacct='echo "sacct: error: Slurm accounting storage is disabled" >&2; exit 1',
        scontrol=(
            "if [[ $1 == show && $2 == config ]]; then\n"
            f"  echo 'JobCompLoc              = {log}'\n"
            "  echo 'JobCompType             = jobcomp/filetxt'\n"
            "else echo 'slurm_load_jobs error: Invalid job id specified' >&2; exit 1; fi"
        ),
    )
    found = slurm.find_job("haico.n", since="2026-12-01T10:00:00Z", environ=env)
    assert found == slurm.NameLookup("42", history=True)
    assert slurm.task_states("42", environ=env) == {
        0: TaskState("FAILED", "75:0"),
        1: TaskState("TIMEOUT", "0:0"),
    }


def test_no_trace_without_accounting_or_a_completion_log_says_only_the_queue_was_seen(
    tmp_path: Path,
) -> None:
    env = stand_ins(
        tmp_path,
        squeue="exit 0",
        sacct='echo "sacct: error: Slurm accounting storage is disabled" >&2; exit 1',
        scontrol="echo 'JobCompType             = jobcomp/none'",
    )
    found = slurm.find_job("haico.n", since="2026-12-01T10:00:00Z", environ=env)
    assert found == slurm.NameLookup(None, history=False)


def test_the_controller_and_accounting_give_each_tasks_state_the_controller_first(
    tmp_path: Path,
) -> None:
    env = stand_ins(
        tmp_path,
        scontrol=(
            "echo 'JobId=9 ArrayJobId=9 ArrayTaskId=2 JobState=RUNNING ExitCode=0:0'\n"
            "echo 'JobId=9 ArrayJobId=9 ArrayTaskId=3-4 JobState=PENDING ExitCode=0:0'"
        ),
        sacct=(
            "echo '9_0|COMPLETED|0:0'; echo '9_1|CANCELLED by 1000|0:15'; echo '9_2|PENDING|0:0'"
        ),
    )
    states = slurm.task_states("9", environ=env)
    assert {task: state.text for task, state in states.items()} == {
        0: "COMPLETED 0:0",
        1: "CANCELLED 0:15",
        2: "RUNNING 0:0",
        3: "PENDING 0:0",
        4: "PENDING 0:0",
    }
    assert [task for task, state in states.items() if state.final] == [0, 1]


def test_a_controller_that_does_not_answer_is_an_error_not_an_unknown_task(
    tmp_path: Path,
) -> None:
    env = stand_ins(
        tmp_path,
        scontrol="echo 'slurm_load_jobs error: Unable to contact slurm controller' >&2; exit 1",
        sacct="echo '9_0|COMPLETED|0:0'",
    )
    with pytest.raises(SlurmError, match="Unable to contact slurm controller"):
        slurm.task_states("9", environ=env)


def test_a_missing_command_names_itself_and_the_fix(tmp_path: Path) -> None:
    with pytest.raises(SlurmError, match="squeue is not on PATH"):
        slurm.find_job("n", since="2026-12-01T10:00:00Z", environ={"PATH": str(tmp_path)})


# -- a job's end time, and its end ---------------------------------------------------------


def test_the_end_time_is_scontrols_when_squeue_fails(tmp_path: Path) -> None:
    env = stand_ins(
        tmp_path,
        squeue='echo "squeue: error: Invalid job id specified" >&2; exit 1',
        scontrol="echo 'JobId=5 JobName=x JobState=RUNNING EndTime=2026-12-01T03:14:15'",
    )
    end = slurm.job_end_time("5", environ=env)
    assert end == datetime(2026, 12, 1, 3, 14, 15).timestamp()  # local time: TZ is passed
    assert (tmp_path / "scontrol.argv").read_text().split() == ["-o", "show", "job", "5"]


def test_an_end_time_neither_command_gives_names_each_ones_problem(tmp_path: Path) -> None:
    env = stand_ins(tmp_path, scontrol="echo 'JobId=6 JobState=RUNNING EndTime=Unknown'")
    with pytest.raises(SlurmError) as raised:
        slurm.job_end_time("5", environ=env)
    assert str(raised.value) == (
        "cannot read the end time of Slurm job 5 (squeue -h -j 5 -o '%A %e': squeue not "
        "found; scontrol -o show job 5: no record of job 5 in its output "
        "'JobId=6 JobState=RUNNING EndTime=Unknown')"
    )


@pytest.mark.parametrize(
    ("scontrol", "ended"),
    [
        ("echo 'JobId=5 JobName=x JobState=RUNNING Reason=None'", False),
        ("echo 'JobId=5 JobName=x JobState=COMPLETING Reason=None'", False),
        ("echo 'JobId=5 JobName=x JobState=COMPLETED Reason=None'", True),
        ("echo 'JobId=5 JobName=x JobState=NODE_FAIL Reason=None'", True),
        ("echo 'slurm_load_jobs error: Invalid job id specified' >&2; exit 1", True),
        ("echo 'slurm_load_jobs error: Unable to contact slurm controller' >&2; exit 1", False),
        ("echo 'JobId=6 JobName=x JobState=COMPLETED Reason=None'", False),
    ],
    ids=[
        "running",
        "completing",
        "completed",
        "node-failed",
        "forgotten",
        "no-controller",
        "another-job",
    ],
)
def test_a_job_has_ended_when_its_state_no_longer_holds_its_nodes_or_slurm_forgot_it(
    tmp_path: Path, scontrol: str, ended: bool
) -> None:
    env = stand_ins(tmp_path, scontrol=scontrol)
    assert slurm.job_has_ended("5", environ=env) is ended


def test_a_job_is_not_over_while_scontrol_cannot_be_asked(tmp_path: Path) -> None:
    assert slurm.job_has_ended("5", environ={"PATH": str(tmp_path)}) is False


def test_how_a_job_stands_now_names_its_batch_host_and_restarts(tmp_path: Path) -> None:
    line = "JobId=5 JobName=serve JobState=RUNNING Restarts=2 BatchHost=gpu07 EndTime=Unknown"
    env = stand_ins(tmp_path, scontrol=f"echo '{line}'")
    record = slurm.job_now("5", environ=env)
    assert record is not None
    assert (record.state, record.batch_host, record.restarts) == ("RUNNING", "gpu07", 2)
    assert (tmp_path / "scontrol.argv").read_text().split() == ["-o", "show", "job", "5"]


def test_a_job_slurm_forgot_stands_nowhere_and_no_answer_is_an_error(tmp_path: Path) -> None:
    forgot = stand_ins(
        tmp_path, scontrol="echo 'slurm_load_jobs error: Invalid job id specified' >&2; exit 1"
    )
    assert slurm.job_now("5", environ=forgot) is None
    with pytest.raises(SlurmError, match="scontrol is not on PATH"):
        slurm.job_now("5", environ={"PATH": str(tmp_path / "empty")})


def test_cancelling_sends_scancel_or_a_signal_to_the_batch_shell(tmp_path: Path) -> None:
    env = stand_ins(tmp_path, scancel="exit 0")
    slurm.cancel("5", environ=env)
    assert (tmp_path / "scancel.argv").read_text().split() == ["5"]
    slurm.cancel("5", signal="USR1", environ=env)
    assert (tmp_path / "scancel.argv").read_text().split() == ["--batch", "-s", "USR1", "5"]


def test_a_job_command_line_exports_its_values_after_the_allow_listed_environment() -> None:
    export = slurm.export_option({"HAICO_PYTHON": "/venv/bin/python", "HAICO_SHARD_COUNT": "4"})
    argv = slurm.sbatch_command(["--nodes=1", export], script="job.sbatch", args=["-x"])
    assert argv == [
        "sbatch",
        "--parsable",
        "--nodes=1",
        "--export=ALL,HAICO_PYTHON=/venv/bin/python,HAICO_SHARD_COUNT=4",
        "job.sbatch",
        "-x",
    ]


def test_a_value_with_a_comma_is_refused_as_sbatch_would_split_it() -> None:
    with pytest.raises(slurm.ExportError) as refused:
        slurm.export_option({"HAICO_PYTHON": "/opt/a,b/python"})
    assert str(refused.value) == (
        "HAICO_PYTHON=/opt/a,b/python has a comma, which sbatch --export cannot pass"
    )
