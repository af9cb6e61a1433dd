"""The submission journal: every step durable, a torn last line tolerated, a damaged line
refused (guessing past it could submit a job twice)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_haico.submit.journal import JobState, Journal, JournalError, PlannedJob


def _plan(name: str = "haico.c.abc.smoke.demo.default") -> PlannedJob:
    return PlannedJob(
        name=name,
        stage="smoke",
        arm="demo",
        stratum="default",
        tasks=(0, 1),
        shard_count=2,
        time_limit="00:30:00",
        pytest_args=("--haico-arm", "demo"),
        continues={"earlier": (1,)},
        argv=("sbatch", "--parsable"),
    )


def test_each_step_is_read_back_with_the_plan_and_the_job_id(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal.jsonl")
    plan = _plan()
    journal.prepare(plan)
    journal.submitting(plan.name)
    journal.submitted(plan.name, "123")
    journal.ended(plan.name, {0: "COMPLETED 0:0", 1: "TIMEOUT 0:0"}, {0: "hn1", 1: "hn3"})
    [job] = journal.read(warn=pytest.fail).values()
    assert job.plan == plan
    assert job.state is JobState.ENDED
    assert job.job_id == "123"
    assert job.ended == {0: "COMPLETED 0:0", 1: "TIMEOUT 0:0"}
    assert job.hosts == {0: "hn1", 1: "hn3"}


def test_an_ended_entry_of_a_journal_from_before_hosts_were_kept_reads_without_them(
    tmp_path: Path,
) -> None:
    journal = Journal(tmp_path / "journal.jsonl")
    plan = _plan()
    journal.prepare(plan)
    journal.submitted(plan.name, "123")
    with open(journal.path, "ab") as handle:
        handle.write(
            b'{"state":"ENDED","job":"%s","time":"x","tasks":{"0":"FAILED 75:0"}}\n'
            % plan.name.encode()
        )
    [job] = journal.read(warn=pytest.fail).values()
    assert job.ended == {0: "FAILED 75:0"}
    assert job.hosts == {}


def test_a_line_torn_by_a_kill_is_skipped_with_a_warning_and_the_next_entry_is_whole(
    tmp_path: Path,
) -> None:
    journal = Journal(tmp_path / "journal.jsonl")
    plan = _plan()
    journal.prepare(plan)
    journal.submitting(plan.name)
    with open(journal.path, "ab") as handle:
        handle.write(b'{"state":"SUBMITTED","job":"haico.c.abc.sm')  # cut mid-write
    warnings: list[str] = []
    [job] = journal.read(warn=warnings.append).values()
    assert job.state is JobState.SUBMITTING
    assert len(warnings) == 1 and "line 3" in warnings[0]

    journal.submitted(plan.name, "7")  # starts on a fresh line
    warnings.clear()
    with pytest.raises(JournalError, match="line 3 is not a journal entry"):
        journal.read(warn=warnings.append)  # the torn line is no longer the last


@pytest.mark.parametrize(
    "line",
    [
        b"garbage\n",
        b'{"state":"SUBMITTED","job":"never-prepared","time":"t","job_id":"1"}\n',
        b'{"state":"LOST","job":"x","time":"t"}\n',
        b'{"state":"SUBMITTED","job":"haico.c.abc.smoke.demo.default","time":"t",'
        b'"job_id":"1; rm"}\n',
    ],
)
def test_a_damaged_line_is_an_error_naming_the_file_and_line(tmp_path: Path, line: bytes) -> None:
    journal = Journal(tmp_path / "journal.jsonl")
    journal.prepare(_plan())
    with open(journal.path, "ab") as handle:
        handle.write(line)
    journal.submitting(_plan().name)
    with pytest.raises(JournalError) as caught:
        journal.read(warn=pytest.fail)
    message = str(caught.value)
    assert f"{journal.path} line 2 is not a journal entry" in message
    assert "\n" not in message


def test_an_unwritable_journal_is_an_error_before_anything_is_submitted(tmp_path: Path) -> None:
    (tmp_path / "not-a-directory").write_text("")
    journal = Journal(tmp_path / "not-a-directory" / "journal.jsonl")
    with pytest.raises(JournalError, match="cannot write the submission journal"):
        journal.prepare(_plan())
