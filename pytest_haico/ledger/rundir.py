"""The run directory claimed by an atomic `mkdir`, and the arm's directories checked and
made (where they are: `ledger.layout`)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from pytest_haico.config.slurm import SlurmJob
from pytest_haico.errors import ResultsError
from pytest_haico.files import (
    DEFAULT_FILE_MODE,
    dir_mode,
    make_dirs,
    ownership_problem,
    write_atomic,
)
from pytest_haico.ledger.layout import CLAIM_FILE, ArmPaths
from pytest_haico.stamps import utc_name


def job_part(job: SlurmJob, *, pid: int | None = None, now: float | None = None) -> str:
    """The job part of a run_id: array job + task, else job, else a local timestamp + pid."""
    part = job.key
    if part is None:
        stamp = utc_name(now)
        return f"local-{stamp}-{os.getpid() if pid is None else pid}"
    return f"{part}r{job.restart_count}" if job.restart_count else part


def check_arm_dirs(paths: ArmPaths) -> None:
    """Refuse the arm's results directories (its campaign's, its own, its ledger,
    transcripts, runs and claims), where they exist, unless each is this user's and writable
    by nobody else: a ledger another user could put there would be taken as its records.
    A symlink is judged by the directory it leads to."""
    for directory in (
        paths.root.parent,
        paths.root,
        paths.ledger_dir,
        paths.transcripts_dir,
        paths.runs_dir,
        paths.claims_dir,
    ):
        try:
            problem = ownership_problem(directory.stat())
        except OSError:  # missing, or unreachable: what makes or reads it says so
            continue
        if problem is not None:
            raise ResultsError(
                f"the results directory {directory} {problem}: records that another user "
                "could put there would be taken as this campaign's. Make it yours and writable "
                "by you only (chmod go-w), or choose a results directory of your own "
                "(--haico-results, or $PYTEST_HAICO_RESULTS)"
            )


@dataclass(frozen=True)
class RunClaim:
    """A run directory this process owns: `runs/<run_id>/`, with `claim.json` inside."""

    run_id: str
    path: Path


def claim_run_dir(
    paths: ArmPaths, part: str, *, node: str | None = None, file_mode: int = DEFAULT_FILE_MODE
) -> RunClaim:
    """Claim `runs/<part>.<k>` for the first free k with `mkdir`, atomic on every file system.

    The arm's directories are made with the results mode (`check_arm_dirs` first refuses
    any that another user could write). `claim.json` appears whole
    or not at all; on an OS error (read-only, full) the new run directory is removed
    again and the error propagates.
    """
    check_arm_dirs(paths)
    for directory in (paths.runs_dir, paths.ledger_dir, paths.transcripts_dir):
        make_dirs(directory, file_mode)
    k = 1
    while True:
        run_id = f"{part}.{k}"
        target = paths.runs_dir / run_id
        try:
            target.mkdir(dir_mode(file_mode))
        except FileExistsError:
            k += 1
            continue
        break
    claim = {
        "host": socket.gethostname(),
        "node": node,  # the Slurm node, as the records name it; None outside a job
        "job": part,
        "pid": os.getpid(),
        "run_id": run_id,
        "claimed_at": time.time(),
    }
    try:
        os.chmod(target, dir_mode(file_mode))  # mkdir's mode went through the umask
        write_atomic(target / CLAIM_FILE, json.dumps(claim).encode() + b"\n", mode=file_mode)
        make_dirs(target / "logs", file_mode)
    except BaseException:
        remove_run_dir(target)
        raise
    return RunClaim(run_id=run_id, path=target)


def is_unused(target: Path) -> bool:
    """Whether the run directory holds nothing but its claim: no log, dump, gates.json."""
    try:
        names = {path.name for path in target.iterdir()}
        return names <= {CLAIM_FILE, "logs"} and not any((target / "logs").iterdir())
    except OSError:
        return False


def remove_run_dir(target: Path) -> None:
    """Undo a claim (failed half-way, or refused): nothing else is in the directory yet."""
    for remove in ((target / "logs").rmdir, (target / CLAIM_FILE).unlink, target.rmdir):
        # A read-only file system keeps the empty directory; it has no claim.json.
        with contextlib.suppress(OSError):
            remove()


# A run_id: the job part (`<array job>_<task>` or `<job>`, `r<restarts>` after a requeue),
# then the claim's number.
_RUN_ID = re.compile(r"(\d+(?:_\d+)?)(?:r(\d+))?\.(\d+)")


def job_key_of(run_id: str) -> str | None:
    """The Slurm job a run_id belongs to across requeues (``13_1`` for ``13_1r2.1``); None
    for a run outside Slurm."""
    match = _RUN_ID.fullmatch(run_id)
    return match[1] if match else None


def runs_of(paths: ArmPaths, key: str) -> list[Path]:
    """The run directories of Slurm job `key` (``13_1``: every requeue, every claim), the
    newest last."""
    found = []
    for path in paths.runs_dir.glob(f"{key}*"):
        match = _RUN_ID.fullmatch(path.name)
        if match and match[1] == key:
            found.append((int(match[2] or 0), int(match[3]), path))
    return [path for _, _, path in sorted(found)]
