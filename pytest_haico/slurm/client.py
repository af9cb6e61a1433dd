"""Slurm's client commands, run with an allow-listed environment.

An `salloc` shell exports SLURM_MEM_PER_CPU, SLURM_CPU_BIND, CUDA_VISIBLE_DEVICES and the
user's OPENAI_* tokens; inherited by `sbatch` they would silently change the new job, or
travel with it. Every command here gets only `ALLOWED_ENV` of the caller's environment.
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime

from pytest_haico.errors import HaicoError

# DESIGN: what sbatch (and so the job, with --export=ALL) may see of the submitting shell.
ALLOWED_ENV = ("HOME", "USER", "LOGNAME", "SHELL", "PATH", "LANG", "TZ", "TMPDIR", "SLURM_CONF")
ALLOWED_PREFIXES = ("LC_",)

_TIMEOUT_S = 120.0


class SlurmError(HaicoError):
    """A Slurm client command is missing, failed or did not answer."""


class NotRun(SlurmError):
    """The command could not be started (not on PATH, not executable): it did nothing."""


class SubmissionRefused(SlurmError):
    """sbatch said the job was not submitted ("Batch job submission failed: ...")."""


def allowed_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The allow-listed part of `environ` (default: this process's)."""
    source = os.environ if environ is None else environ
    return {
        name: value
        for name, value in source.items()
        if name in ALLOWED_ENV or name.startswith(ALLOWED_PREFIXES)
    }


def run(
    argv: Sequence[str],
    *,
    environ: Mapping[str, str] | None = None,
    check: bool = True,
    timeout: float = _TIMEOUT_S,
) -> subprocess.CompletedProcess[str]:
    """Run a Slurm client command with the allow-listed environment and return what it did.

    A command not on PATH, one that does not answer within `timeout`, or (with `check`)
    one that fails is a `SlurmError` saying which and what it printed.
    """
    env = allowed_environment(environ)
    program = shutil.which(argv[0], path=env.get("PATH"))
    if program is None:
        raise NotRun(
            f"{argv[0]} is not on PATH: run haico where Slurm's client commands are "
            "(a login node of the cluster), or add them to PATH"
        )
    try:
        done = subprocess.run(
            [program, *argv[1:]],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as exc:
        raise SlurmError(
            f"{argv[0]} did not answer within {timeout:.0f} s: is slurmctld reachable? "
            "(try `scontrol ping`)"
        ) from exc
    except OSError as exc:
        raise NotRun(f"{argv[0]} could not be run: {exc.strerror or exc}") from exc
    if check and done.returncode != 0:
        said = (done.stderr or done.stdout).strip().splitlines()
        raise SlurmError(
            f"`{' '.join(argv[:2])} ...` failed (exit {done.returncode})"
            + (f": {said[-1]}" if said else "")
        )
    return done


def sbatch(argv: Sequence[str], *, environ: Mapping[str, str] | None = None) -> str:
    """Submit with ``sbatch --parsable`` (in `argv`) and return the job id it answered."""
    done = run(argv, environ=environ, check=False)
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip().splitlines()
        message = f"sbatch failed (exit {done.returncode})" + (f": {said[-1]}" if said else "")
        if any("Batch job submission failed" in line for line in said):
            raise SubmissionRefused(message)
        raise SlurmError(message)
    job_id = done.stdout.strip().split(";")[0]
    if not job_id.isdigit():
        raise SlurmError(f"sbatch answered {done.stdout.strip()!r}, not a job id")
    return job_id


def find_job(name: str, *, since: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The id of this user's job named `name`, submitted at `since` (UTC ISO) or later: from
    the queue, else accounting, else the job completion log; None when none knows it."""
    queued = run(["squeue", "--me", "--name", name, "-h", "-o", "%F"], environ=environ)
    ids = {line.strip() for line in queued.stdout.splitlines() if line.strip().isdigit()}
    if not ids:
        # Relative to now: an absolute -S would be read in sacct's time zone. A minute more
        # allows for clock skew between this host and the controller.
        ago = datetime.now(UTC) - datetime.fromisoformat(since)
        minutes = max(0, math.ceil(ago.total_seconds() / 60)) + 1
        accounted = run(
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
            check=False,
        )
        if accounted.returncode == 0:
            ids = {line.split("_")[0] for line in accounted.stdout.split() if line[:1].isdigit()}
        else:
            ids = {
                fields.get("ArrayJobId") or fields["JobId"]
                for fields in _completion_log(environ)
                if fields.get("Name") == name and "JobId" in fields
            }
    if len(ids) > 1:
        raise SlurmError(
            f"{len(ids)} jobs are named {name} ({', '.join(sorted(ids))}): cancel the "
            "duplicates you do not want (scancel), then run haico again"
        )
    return ids.pop() if ids else None


def task_states(job_id: str, *, environ: Mapping[str, str] | None = None) -> dict[int, str]:
    """Each array task's "STATE EXITCODE" ("RUNNING 0:0", "TIMEOUT 0:0", "FAILED 75:0"):
    from the controller while it keeps the job, else accounting, else the job completion
    log (whose exit code is 0:0 for TIMEOUT and CANCELLED). Tasks no source knows are
    missing."""
    states: dict[int, str] = {}
    shown = run(["scontrol", "-o", "show", "job", job_id], environ=environ, check=False)
    if shown.returncode == 0:
        for line in shown.stdout.splitlines():
            fields = _fields(line)
            if fields.get("ArrayJobId", fields.get("JobId")) != job_id:
                continue
            for task in _task_ids(fields.get("ArrayTaskId", "0")):
                states[task] = f"{fields.get('JobState', '?')} {fields.get('ExitCode', '?')}"
    accounted = run(
        ["sacct", "-X", "-P", "-n", "-j", job_id, "-o", "JobID,State,ExitCode"],
        environ=environ,
        check=False,
    )
    if accounted.returncode == 0:
        for line in accounted.stdout.splitlines():
            parts = line.split("|")
            if len(parts) != 3 or not parts[0].startswith(f"{job_id}_"):
                continue
            for task in _task_ids(parts[0].partition("_")[2].strip("[]")):
                state = parts[1].split()[0] if parts[1] else "?"  # "CANCELLED by 0"
                states.setdefault(task, f"{state} {parts[2]}")
    else:
        for fields in _completion_log(environ):
            if fields.get("ArrayJobId") == job_id and "ArrayTaskId" in fields:
                for task in _task_ids(fields["ArrayTaskId"]):
                    states.setdefault(
                        task, f"{fields.get('JobState', '?')} {fields.get('ExitCode', '?')}"
                    )
    return states


def _completion_log(environ: Mapping[str, str] | None) -> list[dict[str, str]]:
    """The lines of the job completion log (jobcomp/filetxt) as fields; empty when the site
    keeps none or this user cannot read it."""
    config = run(["scontrol", "show", "config"], environ=environ, check=False).stdout
    settings = dict(
        (key.strip(), value.strip())
        for key, sep, value in (line.partition("=") for line in config.splitlines())
        if sep
    )
    if settings.get("JobCompType") != "jobcomp/filetxt" or not settings.get("JobCompLoc"):
        return []
    try:
        with open(settings["JobCompLoc"], encoding="utf-8", errors="replace") as log:
            return [_fields(line) for line in log]
    except OSError:
        return []


def _fields(line: str) -> dict[str, str]:
    """``Key=Value`` words of a scontrol or completion-log line."""
    return dict(
        (key, value) for key, sep, value in (word.partition("=") for word in line.split()) if sep
    )


def _task_ids(text: str) -> list[int]:
    """``3``, ``0-2``, ``1,3``, ``0-7%2`` (a throttle) -> task ids; anything else -> none."""
    ids: list[int] = []
    for part in text.split("%")[0].split(","):
        low, dash, high = part.partition("-")
        if low.isdigit() and (not dash or high.isdigit()):
            ids.extend(range(int(low), int(high or low) + 1))
    return ids
