"""The submission journal: one line per step of each job, so a rerun knows what it did.

Every job goes PREPARED (its sbatch command line) → SUBMITTING (sbatch is about to run) →
SUBMITTED (the job id sbatch answered) → ENDED (each array task's final state). A crash
between SUBMITTING and SUBMITTED leaves a job that may or may not exist: the next run
looks it up by its deterministic name before anything is submitted, and one with no
trace blocks resubmission until the user names it with ``--force``.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_haico.errors import HaicoError, UntrustedFileError
from pytest_haico.files import append_line, read_owned_file
from pytest_haico.stamps import utc_iso

Warn = Callable[[str], None]

JOURNAL_FILE = "journal.jsonl"


class JournalError(HaicoError):
    """The journal cannot be read or written: a rerun could submit a job twice."""


class JobState(enum.StrEnum):
    PREPARED = "PREPARED"
    SUBMITTING = "SUBMITTING"
    SUBMITTED = "SUBMITTED"
    ENDED = "ENDED"


@dataclass(frozen=True)
class PlannedJob:
    """One sbatch array: an arm × stratum of a stage, and the pytest arguments of its tasks."""

    name: str
    stage: str  # smoke, full, continue-<n>
    arm: str
    stratum: str
    tasks: tuple[int, ...]  # the array's task ids: each runs shard <task>/<shard_count>
    shard_count: int
    time_limit: str
    pytest_args: tuple[str, ...]
    depends_on: tuple[str, ...] = ()  # names of the jobs that must end OK first
    # What a continuation runs again: job name -> the task ids it continues.
    continues: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    # The attempts it runs again, as `<job id>_<task>`: Slurm has ended them, so their
    # runs' share claims are its to take (`SlurmJob.supersedes`).
    supersedes: tuple[str, ...] = ()
    why: str = ""  # where the walltime and the array size came from
    argv: tuple[str, ...] = ()  # the sbatch command line, once its dependencies are known
    exclude: tuple[str, ...] = ()  # nodes it must not run on (sbatch --exclude)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "stage": self.stage,
            "arm": self.arm,
            "stratum": self.stratum,
            "tasks": list(self.tasks),
            "shard_count": self.shard_count,
            "time_limit": self.time_limit,
            "pytest_args": list(self.pytest_args),
            "depends_on": list(self.depends_on),
            "continues": {name: list(tasks) for name, tasks in self.continues.items()},
            "supersedes": list(self.supersedes),
            "why": self.why,
            "argv": list(self.argv),
            "exclude": list(self.exclude),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PlannedJob:
        return cls(
            name=str(data["name"]),
            stage=str(data["stage"]),
            arm=str(data["arm"]),
            stratum=str(data["stratum"]),
            tasks=tuple(int(t) for t in data["tasks"]),
            shard_count=int(data["shard_count"]),
            time_limit=str(data["time_limit"]),
            pytest_args=tuple(str(a) for a in data["pytest_args"]),
            depends_on=tuple(str(n) for n in data.get("depends_on", ())),
            continues={
                str(name): tuple(int(t) for t in tasks)
                for name, tasks in data.get("continues", {}).items()
            },
            supersedes=tuple(str(key) for key in data.get("supersedes", ())),
            why=str(data.get("why", "")),
            argv=tuple(str(a) for a in data.get("argv", ())),
            exclude=tuple(str(n) for n in data.get("exclude", ())),
        )


@dataclass
class JournaledJob:
    """What the journal says of one job: its plan, its newest state, its id, its tasks' ends."""

    plan: PlannedJob
    state: JobState
    since: str  # when it entered `state` (UTC, ISO 8601)
    prepared_at: str
    job_id: str | None = None
    # Array task id -> "STATE EXITCODE" (e.g. "TIMEOUT 0:0", "FAILED 75:0").
    ended: dict[int, str] = field(default_factory=dict)
    # Array task id -> the node its batch script ran on, where Slurm said.
    hosts: dict[int, str] = field(default_factory=dict)


class Journal:
    """The journal file of one submission: appended line by line, each line fsynced."""

    def __init__(self, path: Path, *, file_mode: int = 0o640) -> None:
        self.path = path
        self.file_mode = file_mode

    def prepare(self, job: PlannedJob) -> None:
        self._append(JobState.PREPARED, job.name, plan=job.to_json())

    def submitting(self, name: str) -> None:
        self._append(JobState.SUBMITTING, name)

    def submitted(self, name: str, job_id: str, *, how: str = "sbatch") -> None:
        self._append(JobState.SUBMITTED, name, job_id=job_id, how=how)

    def ended(self, name: str, tasks: Mapping[int, str], hosts: Mapping[int, str]) -> None:
        self._append(
            JobState.ENDED,
            name,
            tasks={str(t): s for t, s in sorted(tasks.items())},
            hosts={str(t): h for t, h in sorted(hosts.items())},
        )

    def _append(self, state: JobState, name: str, **fields: Any) -> None:
        entry = {"state": state.value, "job": name, "time": now_iso(), **fields}
        line = json.dumps(entry, separators=(",", ":"), sort_keys=False).encode() + b"\n"
        try:
            append_line(self.path, line, mode=self.file_mode)
        except OSError as exc:
            raise JournalError(
                f"cannot write the submission journal {self.path}: {exc.strerror or exc}; "
                "nothing more is submitted until it can be written (free space, or make it "
                "writable)"
            ) from exc

    def read(self, *, warn: Warn) -> dict[str, JournaledJob]:
        """Every job the journal names, in the order they were prepared. A journal that is
        not a regular file of this user's, writable by it alone, is a `JournalError`: its
        plans are sbatch command lines.

        A last line without its newline is a write a kill cut short: skipped with a
        warning (its step is looked up again). Any other line that is not an entry is a
        `JournalError`: guessing past it could submit a job twice.
        """
        try:
            raw = read_owned_file(self.path)
        except FileNotFoundError:
            return {}
        except UntrustedFileError as exc:
            raise JournalError(
                f"the submission journal {exc} and is not read: haico trusts a journal only "
                "when it is yours and writable by you alone; move the submission aside "
                "(`haico submit` freezes the inputs anew and finds its jobs in Slurm by name)"
            ) from None
        except OSError as exc:
            raise JournalError(
                f"cannot read the submission journal {self.path}: {exc.strerror or exc}"
            ) from exc
        jobs: dict[str, JournaledJob] = {}
        lines = raw.split(b"\n")
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            torn = number == len(lines)  # no newline after it
            try:
                entry = json.loads(line)
                _apply(jobs, entry)
            except (ValueError, KeyError, TypeError) as exc:
                if torn:
                    warn(
                        f"{self.path} line {number}: an entry cut short (a kill while it was "
                        "written); its job is looked up in Slurm again"
                    )
                    continue
                raise JournalError(
                    f"{self.path} line {number} is not a journal entry ({_why(exc)}): the "
                    "journal was edited or damaged; restore that line from a backup, or "
                    "delete it if you know which job it was (squeue --me, sacct)"
                ) from None
        return jobs


def _apply(jobs: dict[str, JournaledJob], entry: Any) -> None:
    if not isinstance(entry, dict):
        raise TypeError("not a JSON object")
    state = JobState(entry["state"])
    name = str(entry["job"])
    time = str(entry["time"])
    if state is JobState.PREPARED:
        plan = PlannedJob.from_json(entry["plan"])
        if plan.name != name:
            raise ValueError(f"its plan names job {plan.name!r}, the entry {name!r}")
        jobs[name] = JournaledJob(plan=plan, state=state, since=time, prepared_at=time)
        return
    job = jobs.get(name)
    if job is None:
        raise KeyError(f"job {name!r} was never prepared")
    if state is JobState.SUBMITTED:
        job.job_id = str(entry["job_id"])
        if not job.job_id.isdigit():
            raise ValueError(f"job id {job.job_id!r}")
    if state is JobState.ENDED:
        job.ended = {int(task): str(end) for task, end in entry["tasks"].items()}
        job.hosts = {int(task): str(host) for task, host in entry.get("hosts", {}).items()}
    job.state = state
    job.since = time


def _why(exc: Exception) -> str:
    if isinstance(exc, KeyError):
        return f"missing {exc}"
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def now_iso() -> str:
    return utc_iso()
