"""One command at a time: an exclusive `flock` on a lock file of the user's own.

`haico submit` and `haico continue` hold one beside a submission's journal from their first
read of it to their last sbatch; `haico env` and `haico serve` hold one beside their jobs'
logs while they look at the queue and submit. Either way, two commands at once can never
both decide that a job is still to be submitted. The holder writes its pid, host and command
into the file; a second command waits a bounded time for it, then stops naming it. Where the
file system has no flock, haico stops rather than go on unlocked (that is how one job name
was once submitted twice); where its flock locks only this host (Lustre's localflock, NFS's
local_lock or nolock, BeeGFS without global file locks), haico stops too, since the
commands it keeps apart may run on a login node and in a job on another node.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from pytest_haico.errors import HaicoError
from pytest_haico.files import ownership_problem
from pytest_haico.stamps import utc_iso

# Long enough for another command's few squeue and sbatch calls on a busy controller; short
# enough that a user at a terminal is told who holds it rather than left waiting.
LOCK_WAIT_S = 60.0
_POLL_S = 0.2
# What flock answers on a file system that does not provide it (Lustre without -o flock,
# some NFS set-ups).
_UNSUPPORTED = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL}


class LockError(HaicoError):
    """A lock that cannot be held safely: not the user's own, not a file, or no flock."""


class LockHeldError(LockError):
    """Another live command held the lock for longer than the wait."""


@contextlib.contextmanager
def holding(
    path: Path,
    *,
    what: str,
    command: str,
    say: Callable[[str], object] | None = None,
    wait_s: float = LOCK_WAIT_S,
) -> Iterator[None]:
    """Hold the lock at `path` (of `what`, e.g. "submission abc") for the `with` block, as
    `haico <command>`. Waits up to `wait_s` for another holder (told through `say` once),
    then raises `LockHeldError` naming it."""
    try:
        fd = os.open(
            path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600
        )
    except OSError as exc:
        raise LockError(f"cannot open the lock {path} of {what}: {exc.strerror or exc}") from exc
    try:
        _check_own(fd, path, what)
        local = host_only_locks(path)
        if local is not None:
            raise LockError(f"cannot lock {path} of {what} safely: {local}")
        _acquire(fd, path, what=what, wait_s=wait_s, say=say)
        since = utc_iso()
        holder = {"pid": os.getpid(), "host": socket.gethostname(), "command": command}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({**holder, "since": since}).encode() + b"\n", 0)
        yield
    finally:
        os.close(fd)  # releases the lock


def host_only_locks(
    path: Path, mountinfo: str | None = None, beegfs_conf: str | None = None
) -> str | None:
    """Why a flock on `path` would hold on this host only (with the fix), or None.

    Read from the mount `path` is on (`/proc/self/mountinfo`, or `mountinfo`): its type and
    options. BeeGFS shows nothing of it in its options: its client configuration does
    (`beegfs_conf`, default ``/etc/beegfs/beegfs-client.conf``)."""
    if mountinfo is None:
        try:
            mountinfo = Path("/proc/self/mountinfo").read_text()
        except OSError:
            return None
    mount = _mount_of(Path(os.path.realpath(path.parent)), mountinfo)
    if mount is None:
        return None
    point, fstype, options = mount
    on = f"{point} is {fstype}"
    if fstype == "lustre" and "localflock" in options:
        return f"{on} mounted with localflock (locks hold on this host only): remount with -o flock"
    if fstype in ("nfs", "nfs4"):
        local = next(
            (o for o in options if o in ("nolock", "local_lock=flock", "local_lock=all")), None
        )
        if local is not None:
            return f"{on} mounted with {local} (locks hold on this host only): remount without it"
    if fstype == "beegfs":
        if beegfs_conf is None:
            try:
                beegfs_conf = Path("/etc/beegfs/beegfs-client.conf").read_text()
            except OSError:
                beegfs_conf = ""
        settings = dict(
            (key.strip(), value.strip())
            for key, sep, value in (line.partition("=") for line in beegfs_conf.splitlines())
            if sep and not key.lstrip().startswith("#")
        )
        if settings.get("tuneUseGlobalFileLocks", "false").lower() != "true":
            return (
                f"{on} without global file locks (locks hold on this host only): set "
                "tuneUseGlobalFileLocks = true in /etc/beegfs/beegfs-client.conf"
            )
    return None


def _mount_of(path: Path, mountinfo: str) -> tuple[str, str, set[str]] | None:
    """The mount point, type and options (mount and super options) of the mount `path` is
    on: the longest mount point above it (the last such, as later mounts hide earlier)."""
    found: tuple[str, str, set[str]] | None = None
    for line in mountinfo.splitlines():
        before, sep, after = line.partition(" - ")
        fields, tail = before.split(), after.split()
        if not sep or len(fields) < 6 or len(tail) < 3:
            continue
        point = fields[4].replace("\\040", " ")
        inside = path == Path(point) or Path(point) in path.parents
        if inside and (found is None or len(point) >= len(found[0])):
            found = (point, tail[0], set(fields[5].split(",")) | set(tail[2].split(",")))
    return found


def _check_own(fd: int, path: Path, what: str) -> None:
    info = os.fstat(fd)
    problem = ownership_problem(info)
    if problem is None and not stat.S_ISREG(info.st_mode):
        problem = "is not a regular file"
    if problem is not None:
        raise LockError(
            f"the lock {path} of {what} {problem}: another user could hold it; remove it"
        )


def _acquire(
    fd: int, path: Path, *, what: str, wait_s: float, say: Callable[[str], object] | None
) -> None:
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
                raise LockError(
                    f"cannot lock {path}: its file system does not support flock "
                    f"([Errno {exc.errno}] {exc.strerror}), and going on unlocked could submit "
                    f"a job twice: {path.parent} must be on a file system with flock (Lustre: "
                    "mounted with -o flock)"
                ) from exc
            raise
        holder = _holder(fd)
        if time.monotonic() >= deadline:
            raise LockHeldError(
                f"{what} is locked by {holder}: wait for it to finish, then run this command again"
            )
        if not told and say is not None:
            say(f"haico: waiting up to {wait_s:g} s for {holder} to finish with {what}")
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
