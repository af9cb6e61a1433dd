"""Campaign jobs under real Slurm daemons: sbatch/campaign.sbatch, arrays, an salloc shell."""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.slurm.cluster import SlurmCluster

REPO = Path(__file__).resolve().parents[2]
WRAPPER = REPO / "sbatch" / "campaign.sbatch"
TERMINAL = {"completed", "expectation_failed", "recursion_limit", "blank_turn", "substituted"}


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A copy of the demo campaign (11 items, one arm), run from its own directory."""
    root = tmp_path / "project"
    shutil.copytree(REPO / "experiments", root / "experiments")
    (root / "pyproject.toml").write_text(
        '[tool.pytest.ini_options]\nasyncio_default_fixture_loop_scope = "function"\n'
        'addopts = ["-p", "no:langsmith_plugin"]\n'
    )
    return root


def _sbatch(cluster: SlurmCluster, project: Path, *args: str) -> str:
    result = cluster.run(
        "sbatch",
        "--parsable",
        f"--chdir={project}",
        f"--export=ALL,HAICO_PYTHON={sys.executable}",
        "--output=job-%A_%a.out" if "--array" in " ".join(args) else "--output=job-%j.out",
        *args,
        check=True,
    )
    return result.stdout.strip().split(";")[0]


def _wait_done(cluster: SlurmCluster, job: str, timeout: float = 180) -> list[str]:
    """Every task's final state, once none of the job's tasks is pending or running."""
    deadline = time.monotonic() + timeout
    while True:
        out = cluster.run("squeue", "-h", "-r", "-t", "all", "-j", job, "-o", "%T").stdout
        states = out.split()
        if states and all(
            s not in ("PENDING", "RUNNING", "COMPLETING", "CONFIGURING") for s in states
        ):
            return states
        if time.monotonic() > deadline:
            pytest.fail(f"job {job} still {states} after {timeout} s")
        time.sleep(0.5)


def _records(project: Path, arm: str = "demo") -> list[dict[str, Any]]:
    ledger = project / "results" / "default" / arm / "ledger"
    return [
        json.loads(line)
        for path in sorted(ledger.glob("*.jsonl"))
        for line in path.read_text().splitlines()
        if line.strip()
    ]


def test_array_with_explicit_shards_runs_every_item_exactly_once(
    slurm_cluster: SlurmCluster, project: Path
) -> None:
    job = _sbatch(slurm_cluster, project, "--array=0-2", "--time=15", str(WRAPPER), "experiments")
    states = _wait_done(slurm_cluster, job)
    logs = "\n".join(p.read_text() for p in sorted(project.glob("job-*.out")))
    assert states == ["COMPLETED"] * 3, logs
    records = _records(project)
    item_ids = [r["item_id"] for r in records]
    assert len(item_ids) == 11, logs
    assert len(set(item_ids)) == 11
    assert {r["verdict"] for r in records} <= TERMINAL
    # Each task wrote its own run's ledger: <array job>_<task>.1
    ledgers = sorted(p.name for p in (project / "results/default/demo/ledger").glob("*.jsonl"))
    assert ledgers == [f"{job}_{task}.1.jsonl" for task in range(3)]
    shards = {r["run_id"]: r["slurm"]["array_task_id"] for r in records}
    assert set(shards.values()) == {"0", "1", "2"}
    # Each run's timeline has its task's job: queued (the array's submission), then started.
    for run in sorted((project / "results/default/demo/runs").iterdir()):
        timeline = json.loads((run / "timeline.json").read_text())
        task_job = timeline["job"]
        assert task_job["queued_at"] <= task_job["started_at"] <= timeline["exit"]["at"], task_job
        assert timeline["phases"]["static_gates"]["end"] <= timeline["phases"]["stack"]["start"]


def test_two_pytest_runs_in_one_salloc_shell_get_two_runs_and_leave_nothing(
    slurm_cluster: SlurmCluster, project: Path
) -> None:
    pytest_cmd = f"{sys.executable} -m pytest experiments -p no:cacheprovider -k demo -q"
    script = (
        f"cd {project} && {pytest_cmd} && {pytest_cmd} --haico-no-resume; echo JOB=$SLURM_JOB_ID"
    )
    result = slurm_cluster.run("salloc", "-N1", "--time=15", "bash", "-c", script)
    assert result.returncode == 0, result.stdout + result.stderr
    job = result.stdout.rsplit("JOB=", 1)[1].strip()
    runs = sorted(p.name for p in (project / "results/default/demo/runs").iterdir())
    assert runs == [f"{job}.1", f"{job}.2"]
    ledgers = sorted(p.name for p in (project / "results/default/demo/ledger").glob("*.jsonl"))
    assert ledgers == [f"{job}.1.jsonl", f"{job}.2.jsonl"]
    by_run: dict[str, int] = {}
    for record in _records(project):
        by_run[record["run_id"]] = by_run.get(record["run_id"], 0) + 1
    assert by_run == {f"{job}.1": 11, f"{job}.2": 11}
    # The allocation has ended: no process of the job is left (services included).
    assert slurm_cluster.processes_of_job(job) == []
