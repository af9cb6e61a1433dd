"""Eight array tasks of one campaign starting at the same moment, as real pytest processes
with their own Slurm job variables: every one makes the results tree it needs (the arm's
directories, its run directory, its share claim) beside the others and ends 0, with
every item recorded once ("exists and is not a directory", exit 4, was the race)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from tests.harness import BackgroundRun, CampaignProject
from tests.polling import wait_for

# Each test runs a child process (the fast loop, `-m "not slow"`, leaves them out).
pytestmark = pytest.mark.subprocess

TASKS = 8
# Every task waits, once collected, just before haico selects its items and makes its
# results tree, for the test to release them all together: the trees are made at the same
# moment rather than one by one.
STARTING_GATE = """
import os
import time
from pathlib import Path


def pytest_collection_modifyitems(items):
    gate = Path(os.environ["HAICO_TEST_GATE"])
    Path(f"{gate}.{os.getpid()}.ready").touch()
    deadline = time.monotonic() + 120
    while not gate.exists():
        assert time.monotonic() < deadline, "the test never opened the gate"
        time.sleep(0.002)
"""


def test_eight_array_tasks_starting_together_all_end_0_with_every_item_recorded_once(
    campaign: CampaignProject, tmp_path: Path
) -> None:
    campaign.arm("demo")
    ids = [f"s{i}" for i in range(2 * TASKS)]
    campaign.simple_scripts(*ids)
    campaign.write("conftest.py", STARTING_GATE)
    gate = tmp_path / "gate"
    tasks: list[BackgroundRun] = []
    for task in range(TASKS):
        env = {
            "HAICO_TEST_GATE": str(gate),
            "SLURM_JOB_ID": str(501 + task),
            "SLURM_ARRAY_JOB_ID": "500",
            "SLURM_ARRAY_TASK_ID": str(task),
            "SLURM_ARRAY_TASK_COUNT": str(TASKS),
        }
        # As the batch script runs it: campaign mode's exit codes (a share left with no
        # item by the hash ends 0, not pytest's 5).
        args = ("--haico-exit=campaign", f"--haico-shard={task}/{TASKS}")
        tasks.append(campaign.start(*args, env=env))

    def all_ready() -> bool:
        return len(list(tmp_path.glob("gate.*.ready"))) == TASKS

    wait_for(all_ready, timeout=120, what=f"{TASKS} tasks at the gate")
    gate.touch()
    for run in tasks:
        assert run.wait(timeout=300) == 0, run.output()
    recorded = Counter(record["script"] for record in campaign.records("demo"))
    assert recorded == Counter(ids)
    runs = {record["run_id"] for record in campaign.records("demo")}
    assert runs <= {f"500_{task}.1" for task in range(TASKS)}
