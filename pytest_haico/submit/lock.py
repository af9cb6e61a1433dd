"""One writer per submission: `haico submit` and `haico continue` hold an exclusive `flock`
on `submissions/.<name>.lock` from their first read of the journal to their last sbatch, so
two of them can never both decide that a job is still to be submitted. The holder writes
its pid, host and command into the file; a second one waits a bounded time for it, then
stops naming it. Where the file system has no flock, haico stops rather than go on
unlocked (that is how one job name was once submitted twice)."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import stat
import time
from collections.abc import Iterator
from pathlib import Path

from pytest_haico.files import ownership_problem
from pytest_haico.submit.jobs import Say, SubmitError
from pytest_haico.submit.journal import now_iso

# Long enough for another command's few sbatch calls on a busy controller; short enough
# that a user at a terminal is told who holds it rather than left waiting.
LOCK_WAIT_S = 60.0
_POLL_S = 0.2
# What flock answers on a file system that does not provide it (Lustre without -o flock,
# some NFS set-ups).
_UNSUPPORTED = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL}


class SubmissionLocked(SubmitError):
    """Another live haico command holds the submission's lock."""


def lock_path(submissions_dir: Path, name: str) -> Path:
    """The lock of submission `name`, beside its directory (which the first `haico submit`
    creates while holding it)."""
    return submissions_dir / f".{name}.lock"


@contextlib.contextmanager
def holding(path: Path, *, command: str, say: Say, wait_s: float = LOCK_WAIT_S) -> Iterator[None]:
    """Hold the lock at `path` for the `with` block: waits up to `wait_s` for another
    holder, then raises `SubmissionLocked` naming it."""
    try:
        fd = os.open(
            path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600
        )
    except OSError as exc:
        raise SubmitError(f"cannot open the submission lock {path}: {exc.strerror or exc}") from exc
    try:
        _check_own(fd, path)
        _acquire(fd, path, wait_s=wait_s, say=say)
        holder = {"pid": os.getpid(), "host": socket.gethostname(), "command": command}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({**holder, "since": now_iso()}).encode() + b"\n", 0)
        yield
    finally:
        os.close(fd)  # releases the lock


def _check_own(fd: int, path: Path) -> None:
    info = os.fstat(fd)
    problem = ownership_problem(info)
    if problem is None and not stat.S_ISREG(info.st_mode):
        problem = "is not a regular file"
    if problem is not None:
        raise SubmitError(
            f"the submission lock {path} {problem}: another user could hold it; remove it"
        )


def _acquire(fd: int, path: Path, *, wait_s: float, say: Say) -> None:
    deadline = time.monotonic() + wait_s
    told = False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            pass
        except OSError as exc:
            if exc.errno in _UNSUPPORTED:
                raise SubmitError(
                    f"cannot lock {path}: its file system does not support flock "
                    f"([Errno {exc.errno}] {exc.strerror}), and going on unlocked could submit "
                    "a job twice: use a results root on a file system with flock (--results; "
                    "Lustre: mounted with -o flock)"
                ) from exc
            raise
        holder = _holder(fd)
        if time.monotonic() >= deadline:
            raise SubmissionLocked(
                f"submission {path.name[1:].removesuffix('.lock')} is locked by {holder}: "
                "wait for it to finish, then run this command again"
            )
        if not told:
            say(f"haico: waiting up to {wait_s:g} s for {holder} to finish with the submission")
            told = True
        time.sleep(_POLL_S)


def _holder(fd: int) -> str:
    """Who holds the lock, as its holder wrote it."""
    try:
        data = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except (OSError, ValueError):
        data = {}
    if not isinstance(data, dict) or "pid" not in data:
        return "another haico command (it has not written its name yet)"
    return (
        f"`haico {data.get('command', '?')}` (pid {data.get('pid')} on host "
        f"{data.get('host', '?')}, since {data.get('since', '?')})"
    )
