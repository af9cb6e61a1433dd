"""Slurm's jobs: the command line that submits one, and submitting it; finding one by its
name (or this user's queued ones), how its array tasks stand, when it ends and whether it
has ended, how it stands now, and cancelling it."""

from __future__ import annotations

import math
import shlex
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from pytest_haico.errors import HaicoError
from pytest_haico.slurm import client
from pytest_haico.slurm.client import IN_JOB_TIMEOUT_S, NoAnswer, NotRun, Run, SlurmError
from pytest_haico.slurm.records import (
    HOLDING_STATES,
    JobRecord,
    TaskState,
    parse_config,
    parse_job_records,
    parse_sacct_job_ids,
    parse_sacct_tasks,
    parse_scontrol_end_time,
    parse_squeue_end_time,
    parse_squeue_job_ids,
    parse_squeue_states,
    record_of,
)


class SubmissionRefused(SlurmError):
    """sbatch said the job was not submitted ("Batch job submission failed: ...")."""


class ExportError(HaicoError):
    """A value a job cannot be given: sbatch's --export splits its list at every comma."""


def sbatch_command(
    options: Iterable[str], *, script: Path | str, args: Iterable[str] = ()
) -> list[str]:
    """The command line of every job haico submits: `sbatch --parsable OPTIONS SCRIPT
    ARGS`, for `sbatch`; `export_option` makes the job's environment among `options`."""
    return ["sbatch", "--parsable", *options, str(script), *args]


def export_option(exports: Mapping[str, str]) -> str:
    """``--export=ALL,KEY=VALUE,...``: the environment sbatch runs with (`client`'s
    allow-list), plus `exports`; a value holding a comma is refused (`ExportError`)."""
    for key, value in exports.items():
        if "," in value:
            raise ExportError(f"{key}={value} has a comma, which sbatch --export cannot pass")
    return ",".join(["--export=ALL", *(f"{key}={value}" for key, value in exports.items())])


def sbatch(argv: Sequence[str], *, environ: Mapping[str, str] | None = None) -> str:
    """Submit with ``sbatch --parsable`` (in `argv`) and return the job id it answered."""
    done = client.run(argv, environ=environ)
    if not done.ok:
        message = f"sbatch failed (exit {done.returncode})" + (
            f": {done.said}" if done.said else ""
        )
        said = (done.stderr or done.stdout).splitlines()
        if any("Batch job submission failed" in line for line in said):
            raise SubmissionRefused(message)
        raise SlurmError(message)
    job_id = done.stdout.strip().split(";")[0]
    if not job_id.isdigit():
        raise SlurmError(f"sbatch answered {done.stdout.strip()!r}, not a job id")
    return job_id


@dataclass(frozen=True)
class NameLookup:
    """What Slurm knows of a job name: the job's id (None: no trace) and whether a source
    that remembers finished jobs answered (accounting or the job completion log), without
    which "no trace" only means "not in the queue"."""

    job_id: str | None
    history: bool


def find_job(name: str, *, since: str, environ: Mapping[str, str] | None = None) -> NameLookup:
    """This user's job named `name`, submitted at `since` (UTC ISO) or later: from the
    queue, else accounting, else the job completion log. Several jobs of that name are a
    `SlurmError` saying what to do."""
    queued = client.run(["squeue", "--me", "--name", name, "-h", "-o", "%F"], environ=environ)
    ids = parse_squeue_job_ids(queued.checked().stdout)
    history = True
    if not ids:
        # Relative to now: an absolute -S would be read in sacct's time zone. A minute more
        # allows for clock skew between this host and the controller.
        ago = datetime.now(UTC) - datetime.fromisoformat(since)
        minutes = max(0, math.ceil(ago.total_seconds() / 60)) + 1
        accounted = client.run(
            [
                "sacct",
                "-X",
                "-P",
                "-n",
                "--name",
                name,
                "-S",
                f"now-{minutes}minutes",
                "-o",
                "JobID",
            ],
            environ=environ,
        )
        if accounted.ok:
            ids = parse_sacct_job_ids(accounted.stdout)
        else:
            logged = _completion_log(environ)
            history = logged is not None
            ids = {job.base_id for job in logged or () if job.name == name}
    if len(ids) > 1:
        raise SlurmError(
            f"{len(ids)} jobs are named {name} ({', '.join(sorted(ids))}): cancel the "
            "duplicates you do not want (scancel), then run haico again"
        )
    return NameLookup(ids.pop() if ids else None, history)


def jobs_named(name: str, *, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """This user's jobs in the queue named `name`: job id -> state (``PENDING``, ...)."""
    argv = ["squeue", "--me", "--name", name, "-h", "-o", "%i %T"]
    return parse_squeue_states(client.run(argv, environ=environ).checked().stdout)


def live_jobs_named(name: str, *, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """`jobs_named` less the jobs only ending (COMPLETING): those still to run, or running."""
    queued = jobs_named(name, environ=environ)
    return {job: state for job, state in queued.items() if state != "COMPLETING"}


def task_states(job_id: str, *, environ: Mapping[str, str] | None = None) -> dict[int, TaskState]:
    """Where each task of array `job_id` stands: from the controller while it keeps the
    job, else accounting, else the job completion log (whose exit code is 0:0 for TIMEOUT
    and CANCELLED). Tasks no source knows are missing; a controller that answers with an
    error other than "Invalid job id" is a `CommandFailed`."""
    states: dict[int, TaskState] = {}
    shown = client.run(["scontrol", "-o", "show", "job", job_id], environ=environ)
    if shown.ok:
        for job in parse_job_records(shown.stdout):
            if job.base_id == job_id:
                states.update(dict.fromkeys(job.tasks, job.task_state))
    elif "Invalid job id" not in shown.stderr:
        # Not "forgotten" (MinJobAge) but a controller that did not answer: what the other
        # sources lack would read as "unknown to Slurm".
        shown.checked()
    accounted = client.run(
        ["sacct", "-X", "-P", "-n", "-j", job_id, "-o", "JobID,State,ExitCode,NodeList"],
        environ=environ,
    )
    if accounted.ok:
        known = parse_sacct_tasks(accounted.stdout, job_id)
    else:
        known = {
            task: job.task_state
            for job in _completion_log(environ) or ()
            if job.array_job_id == job_id and job.array_tasks is not None
            for task in job.array_tasks
        }
    for task, state in known.items():
        states.setdefault(task, state)
    return states


def job_end_time(
    job_id: str, *, environ: Mapping[str, str] | None = None, run: Run = client.run
) -> float | None:
    """The end time of job `job_id` in epoch seconds; None when it has none (UNLIMITED).

    ``squeue -h -j J -o '%A %e'`` first (one field to parse), ``scontrol -o show job J``
    when squeue cannot say. `SlurmError` naming each one's problem when neither can.
    """
    attempts: tuple[tuple[list[str], Callable[[str, str], float | None]], ...] = (
        (["squeue", "-h", "-j", job_id, "-o", "%A %e"], parse_squeue_end_time),
        (["scontrol", "-o", "show", "job", job_id], parse_scontrol_end_time),
    )
    problems = []
    for argv, parse in attempts:
        try:
            answer = run(argv, environ=environ, timeout_s=IN_JOB_TIMEOUT_S)
        except (NotRun, NoAnswer) as exc:
            problem = exc.brief
        else:
            if answer.ok:
                try:
                    return parse(answer.stdout, job_id)
                except ValueError as exc:
                    problem = f"{exc} in its output {answer.first_line or '(nothing)'!r}"
            else:
                problem = f"exit {answer.returncode}: {answer.said or '(nothing)'}"
        problems.append(f"{shlex.join(argv)}: {problem}")
    raise SlurmError(f"cannot read the end time of Slurm job {job_id} ({'; '.join(problems)})")


def job_has_ended(job_id: str, *, environ: Mapping[str, str] | None = None) -> bool:
    """Whether Slurm says the job is over: its state no longer holds its nodes, or Slurm no
    longer knows it (an answer it cannot give, with slurmctld busy or away, is no end)."""
    argv = ["scontrol", "-o", "show", "job", job_id]
    try:
        shown = client.run(argv, environ=environ, timeout_s=IN_JOB_TIMEOUT_S)
    except SlurmError:
        return False
    if not shown.ok:
        return "Invalid job id" in shown.stderr
    record = record_of(parse_job_records(shown.stdout), job_id)
    return record is not None and record.state not in HOLDING_STATES


def job_now(job_id: str, *, environ: Mapping[str, str] | None = None) -> JobRecord | None:
    """The job as the controller shows it now; None when it no longer knows the job.

    `SlurmError` when Slurm cannot say (no answer, not installed): never taken for an end.
    """
    shown = client.run(
        ["scontrol", "-o", "show", "job", job_id], environ=environ, timeout_s=IN_JOB_TIMEOUT_S
    )
    if not shown.ok:
        if "Invalid job id" in shown.stderr:
            return None
        shown.checked()
    return record_of(parse_job_records(shown.stdout), job_id)


def job_queue_times(
    job_id: str, *, environ: Mapping[str, str] | None = None
) -> tuple[float | None, float | None]:
    """When `job_id` was submitted and when it started, from ``scontrol -o show job`` (the
    controller knows a running job's without accounting); None where Slurm does not say."""
    try:
        record = job_now(job_id, environ=environ)
        return (None, None) if record is None else record.queue_times()
    except (SlurmError, ValueError):
        return None, None


def cancel(
    job_id: str, *, signal: str | None = None, environ: Mapping[str, str] | None = None
) -> None:
    """``scancel`` the job, or send it `signal` (``USR1``: to its batch shell only)."""
    argv = ["scancel", job_id] if signal is None else ["scancel", "--batch", "-s", signal, job_id]
    client.run(argv, environ=environ).checked()


def _completion_log(environ: Mapping[str, str] | None) -> list[JobRecord] | None:
    """The records of the job completion log (jobcomp/filetxt); None when the site keeps
    none or this user cannot read it."""
    config = parse_config(client.run(["scontrol", "show", "config"], environ=environ).stdout)
    if config.get("JobCompType") != "jobcomp/filetxt" or not config.get("JobCompLoc"):
        return None
    try:
        with open(config["JobCompLoc"], encoding="utf-8", errors="replace") as log:
            return parse_job_records(log.read())
    except OSError:
        return None
