"""Which tasks `haico continue` owes a rerun, from the journal alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_haico.submit.continuation import _owed
from pytest_haico.submit.journal import Journal, PlannedJob


def _plan(name: str, *, continues: dict[str, tuple[int, ...]] | None = None) -> PlannedJob:
    return PlannedJob(
        name=name,
        stage="continue-1" if continues else "full",
        arm="demo",
        stratum="default",
        tasks=(0, 1, 2, 3),
        shard_count=4,
        time_limit="01:00:00",
        pytest_args=(),
        continues=continues or {},
    )


def test_only_tasks_that_can_go_on_are_owed_and_only_until_a_submitted_job_continues_them(
    tmp_path: Path,
) -> None:
    journal = Journal(tmp_path / "journal.jsonl")
    full = _plan("full")
    journal.prepare(full)
    journal.submitting(full.name)
    journal.submitted(full.name, "10")
    ends = {0: "COMPLETED 0:0", 1: "TIMEOUT 0:0", 2: "FAILED 75:0", 3: "FAILED 78:0"}
    journal.ended(full.name, ends)
    lines: list[str] = []

    [(job, tasks)] = _owed(journal.read(warn=pytest.fail), lines.append)[("demo", "default")]
    # 75 and TIMEOUT go on; 0 finished; 78 (a gate) needs a person, not a rerun.
    assert (job.plan.name, tasks) == ("full", [1, 2])
    assert lines == [
        "haico: full (job 10): task 0 COMPLETED 0:0, task 1 TIMEOUT 0:0 (owed), "
        "task 2 FAILED 75:0 (owed), task 3 FAILED 78:0"
    ]

    # A continuation prepared but never submitted (haico killed before sbatch) continues
    # nothing: the tasks stay owed.
    cont = _plan("cont", continues={"full": (1, 2)})
    journal.prepare(cont)
    assert list(_owed(journal.read(warn=pytest.fail), lambda _: None)) == [("demo", "default")]

    journal.submitting(cont.name)
    journal.submitted(cont.name, "11")
    assert _owed(journal.read(warn=pytest.fail), lambda _: None) == {}
