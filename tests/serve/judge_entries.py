"""A judge registered in a test's catalogue: an entry of this user's pointing at a model server
on this host, its key file, and a `scontrol` that says its job runs."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from pytest_haico.serve.catalogue import (
    CatalogueEntry,
    EntryJob,
    EntryOwner,
    ServedIdentity,
    key_file_name,
    now_utc,
    register,
)
from pytest_haico.slurm.records import JobRecord

JUDGE_MODEL = (
    "path:/models/judge;config.json:" + "a" * 64 + ";model.safetensors.index.json:" + ("b" * 64)
)
NODE = socket.gethostname()


def register_judge(
    catalogue: Path,
    *,
    port: int,
    served_name: str,
    key: str,
    name: str = "judge",
    job: str = "41",
) -> CatalogueEntry:
    """Register `name` served at 127.0.0.1:`port` by job `job` on this host."""
    entry = CatalogueEntry(
        name=name,
        host="127.0.0.1",
        port=port,
        served_name=served_name,
        identity=ServedIdentity(model=JUDGE_MODEL, vllm={}, vllm_version="0.13.0"),
        job=EntryJob(id=job, node=NODE, restart_count=0, end_time=None),
        owner=EntryOwner(uid=os.geteuid(), name="me"),
        arm=name,
        registered_at=now_utc(),
        key_file=key_file_name(name, job),
    )
    register(catalogue, entry, key, file_mode=0o640, key_group=None)
    return entry


def running(job_id: str) -> JobRecord:
    """A job lookup's answer: every job runs on this host, never requeued."""
    return JobRecord(job_id=job_id, state="RUNNING", batch_host=NODE, restarts=0)


def scontrol_shim(bin_dir: Path) -> Path:
    """`scontrol` that shows any job as running on this host (put `bin_dir` first on PATH)."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    path = bin_dir / "scontrol"
    path.write_text(
        "#!/bin/sh\n"
        '# scontrol -o show job <id>\necho "JobId=$4 JobName=haico.serve JobState=RUNNING '
        f'BatchHost={NODE} Restarts=0"\n'
    )
    path.chmod(0o755)
    return path
