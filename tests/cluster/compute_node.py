"""A compute node of a running Slurm job, as the cluster profile's campaigns see it (squeue and
scontrol answering as Slurm's do), and what a campaign's stacks must leave behind: nothing."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from pytest_haico.procfs import iter_processes
from tests.harness import CampaignProject

# Writes the secrets and the service processes of every stack the session started to
# $HAICO_TEST_STACKS (outside the results directory) when pytest ends: the secrets the test
# then looks for everywhere else, the processes that must be gone.
STACKS_CONFTEST = """
import json
import os
from pathlib import Path

from pytest_haico.runner.arm_runs import ARM_RUNS_KEY


def pytest_unconfigure(config):
    runs = config.stash.get(ARM_RUNS_KEY, None)
    stacks = [run.stack for run in runs.runs.values()] if runs is not None else []
    stacks = [stack for stack in stacks if stack is not None]
    found = {
        "secrets": [secret for stack in stacks for secret in stack.secrets],
        "pids": {
            name: process.pid
            for stack in stacks
            for name, process in stack.orchestrator.processes.items()
        },
    }
    Path(os.environ["HAICO_TEST_STACKS"]).write_text(json.dumps(found))
"""


def make_fake_slurm(directory: Path, *, job_id: str, host: str, end: datetime) -> Path:
    """`squeue` and `scontrol` printing what Slurm's print for running job `job_id` on `host`
    (its end time in local time, as Slurm prints it); put `directory` on PATH."""
    directory.mkdir(parents=True)
    end_time = end.strftime("%Y-%m-%dT%H:%M:%S")
    start_time = (end - timedelta(hours=4)).strftime("%Y-%m-%dT%H:%M:%S")
    record = (
        f"JobId={job_id} JobName=campaign UserId=researcher(1000) GroupId=researcher(1000) "
        f"JobState=RUNNING Reason=None RunTime=00:10:00 TimeLimit=04:00:00 "
        f"StartTime={start_time} EndTime={end_time} Partition=gpu NodeList={host} "
        f"BatchHost={host} NumNodes=1 NumCPUs=16 TRES=cpu=16,mem=64G,node=1,gres/gpu=2"
    )
    scripts = {
        # squeue -h -j <id> -o '%A %e'
        "squeue": f"#!/bin/sh\nprintf '%s %s\\n' '{job_id}' '{end_time}'\n",
        # scontrol show hostnames <list> | -o show job <id> | --version
        "scontrol": (
            "#!/bin/sh\n"
            'case "$1" in\n'
            "  --version) echo 'slurm 23.11.4' ;;\n"
            f"  show) echo '{host}' ;;\n"
            f"  -o) echo '{record}' ;;\n"
            "  *) echo \"scontrol: error: invalid command '$1'\" >&2; exit 1 ;;\n"
            "esac\n"
        ),
    }
    for name, text in scripts.items():
        (directory / name).write_text(text)
        (directory / name).chmod(0o755)
    return directory


def survivors(pids: Iterable[int], needle: str) -> list[str]:
    """Live processes that are one of `pids`, in one of their sessions (each service runs in
    its own), or whose command line names `needle`."""
    pids = set(pids)
    found = []
    for stat in iter_processes():
        try:
            cmdline = Path(f"/proc/{stat.pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, UnicodeDecodeError):
            continue
        if stat.pid in pids or stat.sid in pids or needle in cmdline:
            found.append(f"{stat.pid}: {cmdline}")
    return found


def enter_compute_node(
    project: CampaignProject,
    monkeypatch: pytest.MonkeyPatch,
    *,
    job_id: str,
    host: str,
    gpus: str,
    path: str,
    environ: Mapping[str, str],
) -> Path:
    """Put the runs `project` starts on a compute node of running Slurm job `job_id` on `host`
    with `gpus` visible: fake squeue and scontrol first on PATH (`path` after them), the
    project's conftest writing its stacks' secrets and processes to the file returned, and
    `environ` besides; the variables of another job or site unset."""
    project.write("conftest.py", STACKS_CONFTEST)
    end = datetime.now() + timedelta(hours=2)
    slurm_bin = make_fake_slurm(project.root / "slurm-bin", job_id=job_id, host=host, end=end)
    stacks_file = project.root / "stacks.json"
    node = {
        "SLURM_JOB_ID": job_id,
        "SLURM_JOB_NODELIST": host,
        "SLURM_JOB_NUM_NODES": "1",
        "CUDA_VISIBLE_DEVICES": gpus,
        "PATH": f"{slurm_bin}:{path}",
        "HAICO_TEST_STACKS": str(stacks_file),
    }
    for name, value in {**node, **environ}.items():
        monkeypatch.setenv(name, value)
    for name in ("OPENAI_ENDPOINT_URL", "SLURM_NNODES", "SLURM_NODELIST", "VLLM_VENV"):
        monkeypatch.delenv(name, raising=False)
    return stacks_file
