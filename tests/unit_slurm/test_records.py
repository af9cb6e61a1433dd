"""Slurm's command outputs read into typed records: timestamps, job records, end times."""

from __future__ import annotations

from datetime import datetime

import pytest

from pytest_haico.slurm.records import (
    LAUNCH_HELD,
    JobRecord,
    TaskState,
    parse_job_records,
    parse_sacct_tasks,
    parse_scontrol_end_time,
    parse_slurm_time,
    parse_squeue_end_time,
)

END = "2026-12-01T03:14:15"
END_S = datetime.fromisoformat(END).timestamp()


def test_a_slurm_timestamp_is_local_time_without_a_zone() -> None:
    assert parse_slurm_time(END) == datetime(2026, 12, 1, 3, 14, 15).timestamp()
    assert parse_slurm_time(f" {END}\n") == END_S


@pytest.mark.parametrize("text", ["Unknown", "N/A", "NONE", "", "  \n"])
def test_slurm_words_for_no_end_time_mean_no_limit(text: str) -> None:
    assert parse_slurm_time(text) is None


@pytest.mark.parametrize("text", ["garbage", "Tomorr 03:14", "0001-01-01T00:00:00"])
def test_anything_else_is_not_a_timestamp(text: str) -> None:
    with pytest.raises(ValueError):
        parse_slurm_time(text)


def test_squeue_line_is_picked_by_job_id_among_an_arrays_tasks() -> None:
    # `squeue -j 2` of an array's base id lists its pending tasks (2) and a running one (3).
    stdout = "2 2026-12-01T03:02:00\n3 2026-12-01T02:52:11\n"
    assert parse_squeue_end_time(stdout, "3") == parse_slurm_time("2026-12-01T02:52:11")
    assert parse_squeue_end_time(stdout, "2") == parse_slurm_time("2026-12-01T03:02:00")
    assert parse_squeue_end_time("123 NONE\n", "123") is None
    with pytest.raises(ValueError, match="no line for job 4"):
        parse_squeue_end_time(stdout, "4")


def test_scontrol_record_is_picked_by_job_id() -> None:
    stdout = (
        "JobId=2 ArrayJobId=2 ArrayTaskId=1-2 JobState=PENDING EndTime=2026-12-01T03:02:00 "
        "Deadline=N/A\n"
        "JobId=3 ArrayJobId=2 ArrayTaskId=0 JobState=RUNNING StartTime=2026-12-01T02:47:11 "
        "EndTime=2026-12-01T02:52:11 Deadline=N/A\n"
    )
    assert parse_scontrol_end_time(stdout, "3") == parse_slurm_time("2026-12-01T02:52:11")
    assert parse_scontrol_end_time("JobId=9 EndTime=Unknown\n", "9") is None
    with pytest.raises(ValueError, match="no record of job 23"):
        parse_scontrol_end_time(stdout, "23")
    with pytest.raises(ValueError, match="no EndTime="):
        parse_scontrol_end_time("JobId=9 JobState=RUNNING\n", "9")


def test_a_record_of_scontrol_or_the_completion_log_is_typed() -> None:
    scontrol = (
        "JobId=3 ArrayJobId=2 ArrayTaskId=0 JobName=haico.n UserId=u(1) JobState=TIMEOUT "
        "ExitCode=0:15 EndTime=2026-12-01T02:52:11 Command=/x/run JobState=COMPLETED\n"
        "JobId=2 ArrayJobId=2 ArrayTaskId=1-3%2 JobName=haico.n JobState=PENDING\n"
        "\n"
        "no record on this line\n"
        "JobId=7 Name=other JobState=COMPLETED ExitCode=0:0\n"  # the completion log's Name=
    )
    timed_out, pending, alone = parse_job_records(scontrol)
    # The first of two words alike is Slurm's own: a job's free text comes after it.
    assert timed_out == JobRecord(
        job_id="3",
        name="haico.n",
        array_job_id="2",
        array_tasks=(0,),
        state="TIMEOUT",
        exit_code="0:15",
        end="2026-12-01T02:52:11",
    )
    assert timed_out.task_state == TaskState("TIMEOUT", "0:15")
    assert (pending.base_id, pending.tasks, pending.end) == ("2", (1, 2, 3), None)
    assert (alone.base_id, alone.name, alone.tasks, alone.array_tasks) == ("7", "other", (0,), None)


def test_a_records_queue_times_are_its_submission_and_its_start() -> None:
    line = f"JobId=5 JobState=RUNNING SubmitTime=2026-12-01T03:14:00 StartTime={END}\n"
    (running,) = parse_job_records(line)
    assert running.queue_times() == (END_S - 15, END_S)
    pending = JobRecord(job_id="6", submit=END, start="Unknown")
    assert pending.queue_times() == (END_S, None)
    assert JobRecord(job_id="7").queue_times() == (None, None)  # the line does not say
    with pytest.raises(ValueError, match="'soon'"):
        JobRecord(job_id="8", start="soon").queue_times()


def test_sacct_lists_each_task_once_with_its_state_word() -> None:
    stdout = "9_0|COMPLETED|0:0\n9_1|CANCELLED by 1000|0:15\n9_[2-3]|PENDING|0:0\n10_0|FAILED|1:0\n"
    assert parse_sacct_tasks(stdout, "9") == {
        0: TaskState("COMPLETED", "0:0"),
        1: TaskState("CANCELLED", "0:15"),
        2: TaskState("PENDING", "0:0"),
        3: TaskState("PENDING", "0:0"),
    }


@pytest.mark.parametrize(
    ("state", "final"),
    [("COMPLETED", True), ("FAILED", True), ("TIMEOUT", True), ("CANCELLED", True),
     ("RUNNING", False), ("PENDING", False), ("COMPLETING", False), ("?", False)],
)  # fmt: skip
def test_a_task_is_final_in_a_state_it_never_leaves(state: str, final: bool) -> None:
    assert TaskState(state, "0:0").final is final


def test_a_pending_task_held_after_its_launch_failed_says_so_and_no_other_reason_is_kept() -> None:
    line = (
        "JobId=12 ArrayJobId=7 ArrayTaskId=1 JobName=x JobState=PENDING "
        "Reason=launch_failed_requeued_held ExitCode=0:0 BatchHost=node2"
    )
    [held] = parse_job_records(line)
    assert held.task_state == TaskState("PENDING", "0:0", "node2", LAUNCH_HELD)
    assert held.task_state.launch_held
    [waiting] = parse_job_records(line.replace("launch_failed_requeued_held", "Resources"))
    assert waiting.task_state.reason is None and not waiting.task_state.launch_held
