"""The run's timeline: written whole at every phase change, shares of the allocation."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import pytest_haico
from pytest_haico.ledger.timeline import (
    EXEC_SLACK_S,
    Timeline,
    job_section,
    process_started_at,
    shares,
)
from pytest_haico.procfs import read_proc_stat


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _timeline(tmp_path: Path, clock: Clock, job: dict[str, object] | None = None) -> Timeline:
    return Timeline(tmp_path, run_id="r1", campaign="c", arm="a", session="s", job=job, clock=clock)


def test_the_file_exists_from_the_start_and_follows_each_phase(tmp_path: Path) -> None:
    clock = Clock()
    timeline = _timeline(tmp_path, clock)
    doc = json.loads((tmp_path / "timeline.json").read_text())
    assert doc["schema"] == 1 and doc["run_id"] == "r1" and doc["phases"] == {}
    timeline.start("static_gates")
    clock.now = 1002.0
    timeline.end("static_gates")
    doc = json.loads((tmp_path / "timeline.json").read_text())
    assert doc["phases"]["static_gates"] == {"start": 1000.0, "end": 1002.0}
    assert not list(tmp_path.glob("*.tmp*"))


def test_conversations_widen_conversing_and_the_first_drain_cause_wins(tmp_path: Path) -> None:
    clock = Clock()
    timeline = _timeline(tmp_path, clock)
    timeline.conversation(start=1010.0, end=1020.0)
    timeline.conversation(start=1005.0, end=1015.0)
    timeline.drain("walltime")
    timeline.drain("signal", signal="SIGTERM")
    phases = json.loads(timeline.path.read_text())["phases"]
    assert phases["conversing"] == {"first_start": 1005.0, "last_end": 1020.0}
    assert phases["drain"]["cause"] == "walltime"


def test_an_unknown_phase_or_cause_is_refused(tmp_path: Path) -> None:
    timeline = _timeline(tmp_path, Clock())
    with pytest.raises(ValueError, match="unknown phase"):
        timeline.start("lunch")
    with pytest.raises(ValueError, match="drain cause"):
        timeline.drain("boredom")


def test_job_section_comes_from_slurms_environment() -> None:
    assert job_section({}) is None
    env = {"SLURM_JOB_ID": "42", "SLURM_GPUS_ON_NODE": "4", "SLURM_JOB_START_TIME": "900"}
    assert job_section(env, queued_at=800.0) == {
        "id": "42",
        "gpus": 4,
        "queued_at": 800.0,
        "started_at": 900.0,
    }
    assert job_section({"SLURM_JOB_ID": "7", "SLURM_JOB_GPUS": "0,1"})["gpus"] == 2  # type: ignore[index]


def test_shares_of_the_allocation(tmp_path: Path) -> None:
    clock = Clock()
    timeline = _timeline(tmp_path, clock, job={"id": "1", "gpus": 2, "started_at": 1000.0})
    timeline.start("stack")
    clock.now = 1010.0
    timeline.end("stack")
    timeline.conversation(start=1010.0, end=1070.0)
    clock.now = 1070.0
    timeline.start("drain")
    clock.now = 1080.0
    timeline.end("drain")
    timeline.start("final_dump")
    clock.now = 1100.0
    timeline.end("final_dump")
    timeline.exit(0)
    got = shares(json.loads(timeline.path.read_text()))
    assert got["allocation_s"] == 100.0
    assert got["gpu_hours"] == pytest.approx(200 / 3600)
    assert (got["starting"], got["conversing"], got["draining"], got["dumping"]) == (
        0.1,
        0.6,
        0.1,
        0.2,
    )


def _proc_start() -> float:
    stat = read_proc_stat(os.getpid())
    assert stat is not None
    lines = Path("/proc/stat").read_text().splitlines()
    btime = next(int(line.split()[1]) for line in lines if line.startswith("btime "))
    return btime + stat.start_time / os.sysconf("SC_CLK_TCK")


def test_the_process_start_is_the_one_proc_gives_unless_pytest_haico_was_loaded_long_after(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    started = _proc_start()
    monkeypatch.setattr(pytest_haico, "LOADED_AT", started + 0.4)
    assert process_started_at() == started
    # A process that lived before it exec'd pytest: its /proc start is the older process's.
    monkeypatch.setattr(pytest_haico, "LOADED_AT", started + EXEC_SLACK_S + 30)
    assert process_started_at() == started + EXEC_SLACK_S + 30


@pytest.mark.subprocess
def test_a_process_that_a_shell_replaced_by_exec_starts_when_it_loaded_pytest_haico() -> None:
    # `bash -c 'pip install … && pytest …'` execs pytest: the shell's start is not the run's.
    code = "import time; from pytest_haico.ledger.timeline import process_started_at as p; "
    code += "print(time.time() - p())"
    waited = EXEC_SLACK_S + 1
    shell = f"sleep {waited} && exec {sys.executable} -c '{code}'"
    began = time.time()
    done = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert 0 <= float(done.stdout) < time.time() - began - waited + 1


def test_a_phase_timed_before_the_timeline_existed_is_recorded_with_its_times(
    tmp_path: Path,
) -> None:
    clock = Clock()
    timeline = _timeline(tmp_path, clock)
    timeline.span("static_gates", start=990.0, end=995.5)
    doc = json.loads((tmp_path / "timeline.json").read_text())
    assert doc["phases"]["static_gates"] == {"start": 990.0, "end": 995.5}
