"""A stack `haico stack up` keeps in an allocation dies with it: the allocation's end stops
the supervisor (which has its own session, so Slurm's signals to the shell miss it), after
a final dump, and every service with it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from pytest_haico import procfs
from tests.polling import wait_for
from tests.slurm.cluster import SlurmCluster


def test_a_kept_stack_ends_with_its_allocation(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    project = tmp_path / "project"
    subprocess.run(
        [sys.executable, "-m", "pytest_haico", "init", str(project)],
        check=True,
        capture_output=True,
    )
    tmpdir = Path(tempfile.mkdtemp(prefix="haico-kept-slurm-"))
    tmpdir.chmod(0o711)  # a Postgres run as another user (under root) reaches its data by name
    state = tmpdir / f"pytest-haico-{os.getuid()}" / "stacks" / "standin.json"
    go = tmp_path / "go"
    env = {**os.environ, **slurm_cluster.env, "TMPDIR": str(tmpdir)}
    shell = (
        f"{sys.executable} -m pytest_haico stack up standin && "
        f"while [ ! -e {go} ]; do sleep 0.2; done"
    )
    log = (tmp_path / "salloc.out").open("wb")
    salloc = subprocess.Popen(
        ["salloc", "--time=5", "--job-name=kept", "bash", "-c", shell],
        cwd=project,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_for(state.exists, timeout=120, what="the kept stack in the allocation")
        kept = json.loads(state.read_text())
        job = kept["allocation"]
        assert slurm_cluster.job_fields(job)["JobState"] == "RUNNING"
        processes = [(kept["supervisor_pid"], kept["supervisor_start_time"])] + [
            (s["pid"], s["start_time"]) for s in kept["services"]
        ]
        assert all(procfs.is_alive(pid, start) for pid, start in processes)

        slurm_cluster.run("scancel", job, check=True)
        wait_for(
            lambda: not any(procfs.is_alive(pid, start) for pid, start in processes),
            timeout=60,
            what="the kept stack to end with its allocation",
        )
        supervisor_log = (Path(kept["directory"]) / "supervisor.log").read_text()
        assert f"allocation {job} has ended" in supervisor_log, supervisor_log
        assert len(list((Path(kept["directory"]) / "dumps").glob("final-*.dump"))) == 1
        assert not state.exists()
    finally:
        go.touch()
        salloc.kill()
        salloc.wait(timeout=60)
        log.close()
        if state.exists():
            pid = json.loads(state.read_text())["supervisor_pid"]
            subprocess.run(["kill", "-9", str(pid)], check=False)
        shutil.rmtree(tmpdir, ignore_errors=True)
