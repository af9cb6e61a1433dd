"""What the Slurm job this process runs in says about itself (its environment)."""

from __future__ import annotations

import socket
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class SlurmJob:
    """The job's identity as Slurm exports it; every field is None outside a job."""

    job_id: str | None
    array_job_id: str | None
    array_task_id: str | None
    restart_count: int
    node: str

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> SlurmJob:
        restarts = environ.get("SLURM_RESTART_COUNT", "0")
        return cls(
            job_id=environ.get("SLURM_JOB_ID") or None,
            array_job_id=environ.get("SLURM_ARRAY_JOB_ID") or None,
            array_task_id=environ.get("SLURM_ARRAY_TASK_ID") or None,
            restart_count=int(restarts) if restarts.isdigit() else 0,
            node=environ.get("SLURMD_NODENAME") or socket.gethostname(),
        )

    @property
    def in_job(self) -> bool:
        return self.job_id is not None

    @property
    def in_array(self) -> bool:
        return self.array_task_id is not None
