"""The results layout of one arm, and the run directory claimed by an atomic `mkdir`."""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from pytest_haico.config.slurm import SlurmJob


def job_part(job: SlurmJob, *, pid: int | None = None, now: float | None = None) -> str:
    """The job part of a run_id: array job + task, else job, else a local timestamp + pid."""
    if job.array_job_id and job.array_task_id:
        part = f"{job.array_job_id}_{job.array_task_id}"
    elif job.job_id:
        part = job.job_id
    else:
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))
        return f"local-{stamp}-{os.getpid() if pid is None else pid}"
    return f"{part}r{job.restart_count}" if job.restart_count else part


@dataclass(frozen=True)
class ArmPaths:
    """Where one arm's results live: `<results>/<campaign>/<arm>/`."""

    root: Path

    @property
    def ledger_dir(self) -> Path:
        return self.root / "ledger"

    @property
    def transcripts_dir(self) -> Path:
        return self.root / "transcripts"

    @property
    def runs_dir(self) -> Path:
        return self.root / "runs"

    def ledger(self, run_id: str) -> Path:
        return self.ledger_dir / f"{run_id}.jsonl"

    def transcript(self, item_id: str, run_id: str, attempt: int) -> Path:
        return self.transcripts_dir / f"{item_id}.{run_id}.{attempt}.jsonl"


@dataclass(frozen=True)
class RunClaim:
    """A run directory this process owns: `runs/<run_id>/`, with `claim.json` inside."""

    run_id: str
    path: Path


def claim_run_dir(paths: ArmPaths, part: str) -> RunClaim:
    """Claim `runs/<part>.<k>` for the first free k with `mkdir`, atomic on every file system."""
    paths.runs_dir.mkdir(parents=True, exist_ok=True)
    k = 1
    while True:
        run_id = f"{part}.{k}"
        target = paths.runs_dir / run_id
        try:
            target.mkdir()
        except FileExistsError:
            k += 1
            continue
        claim = {
            "host": socket.gethostname(),
            "job": part,
            "pid": os.getpid(),
            "run_id": run_id,
            "claimed_at": time.time(),
        }
        fd = os.open(target / "claim.json", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        with os.fdopen(fd, "w") as handle:
            json.dump(claim, handle)
            handle.write("\n")
        return RunClaim(run_id=run_id, path=target)
