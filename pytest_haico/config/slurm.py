"""What the Slurm job this process runs in says about itself (its environment)."""

from __future__ import annotations

import socket
from collections.abc import Mapping
from dataclasses import dataclass

from pytest_haico.errors import ConfigError

# Slurm's job ids, array task ids and restart counts are decimal numbers. They become
# parts of run ids and file names, so anything else (`a/b`, `../x`) is refused.
SUPERSEDES_ENV = "HAICO_SUPERSEDES"
_NUMERIC = ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_RESTART_COUNT")


@dataclass(frozen=True)
class SlurmJob:
    """The job's identity as Slurm exports it; every field is None outside a job."""

    job_id: str | None
    array_job_id: str | None
    array_task_id: str | None
    restart_count: int
    node: str
    # The job this one continues in a chain (`HAICO_CHAIN_PREV`, set by campaign.sbatch):
    # Slurm started this one only after that one ended.
    chain_predecessor: str | None = None
    # The attempts a continuation runs again (`HAICO_SUPERSEDES`, set by `haico continue`
    # once Slurm had ended them): their job keys, `<array job>_<task>`.
    supersedes: tuple[str, ...] = ()

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> SlurmJob:
        """Read the job's variables; a malformed one is a `ConfigError` naming it."""
        values = {name: parse_slurm_number(environ, name) for name in _NUMERIC}
        restarts = values["SLURM_RESTART_COUNT"]
        return cls(
            job_id=values["SLURM_JOB_ID"],
            array_job_id=values["SLURM_ARRAY_JOB_ID"],
            array_task_id=values["SLURM_ARRAY_TASK_ID"],
            restart_count=int(restarts) if restarts is not None else 0,
            node=environ.get("SLURMD_NODENAME") or socket.gethostname(),
            chain_predecessor=_parse_job_key(environ, "HAICO_CHAIN_PREV"),
            supersedes=_parse_job_keys(environ, SUPERSEDES_ENV),
        )

    @property
    def in_job(self) -> bool:
        return self.job_id is not None

    @property
    def in_array(self) -> bool:
        return self.array_task_id is not None

    @property
    def ended_before(self) -> tuple[str, ...]:
        """Jobs that Slurm had ended before this one started: the chain's previous link,
        the attempts this continuation runs again."""
        before = (self.chain_predecessor,) if self.chain_predecessor else ()
        return before + self.supersedes

    @property
    def key(self) -> str | None:
        """The job across requeues: array job and task, else the job id; None outside a job."""
        if self.array_job_id and self.array_task_id:
            return f"{self.array_job_id}_{self.array_task_id}"
        return self.job_id


def parse_slurm_number(environ: Mapping[str, str], name: str) -> str | None:
    """The variable's digits, None when unset or empty; anything else is a `ConfigError`."""
    value = environ.get(name, "")
    if value == "":
        return None
    if not (value.isascii() and value.isdigit()):
        raise _refused(
            name,
            value,
            "is not a Slurm job number (digits only, as Slurm sets it); unset it, or run "
            "inside the Slurm job it belongs to",
        )
    return value


def _parse_job_key(environ: Mapping[str, str], name: str) -> str | None:
    """A job's key as `SlurmJob.key` spells it (`123`, or `123_4` for an array task)."""
    value = environ.get(name, "")
    return _job_key(value, name, value) if value else None


def _parse_job_keys(environ: Mapping[str, str], name: str) -> tuple[str, ...]:
    """Job keys as `SlurmJob.key` spells them, `:`-separated (sbatch --export cannot pass
    a comma)."""
    value = environ.get(name, "")
    return tuple(_job_key(key, name, value) for key in value.split(":")) if value else ()


def _job_key(key: str, name: str, value: str) -> str:
    """`key` when it is a job key; else a `ConfigError` naming variable `name`, whose
    value is `value`."""
    job, underscore, task = key.partition("_")
    parts = (job, task) if underscore else (job,)
    if not all(part.isascii() and part.isdigit() for part in parts):
        raise _refused(
            name,
            value,
            "is not a Slurm job (digits, or <array job>_<task>, as haico sets it); unset it",
        )
    return key


def _refused(name: str, value: str, why: str) -> ConfigError:
    shown = value if len(value) <= 64 else value[:64] + "..."
    return ConfigError(f"environment variable {name}", "", f"{shown!r} {why}")
