"""Share claims: at most one live run per campaign × arm × shard × stratum.

Two runs of the same share (a double `sbatch`) would both run every item. Locks do not
work across nodes on shared file systems, so a claim is a file made with `link`, which is
atomic everywhere, NFS included, and complete from its first moment. It records its
holder; it is stale when the holder is dead: on the same host, its pid is gone or was
reused (another start time, another boot); on another host, only when it is this very
job's earlier incarnation (Slurm runs one incarnation of a job at a time) or a job Slurm
had ended before this one started (the link a chain continues, the attempt a continuation
runs again). Whether any other holder on another host is alive cannot be told from here:
the refusal names the file to remove once that run is known dead.

A holder judged dead may live on (a node cut off the network whose job Slurm ended): it
sees at its next record that the claim is no longer its own, gone included, and stops.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from pytest_haico import procfs
from pytest_haico.config.slurm import SlurmJob
from pytest_haico.errors import ResultsError, ShareClaimedError
from pytest_haico.files import NotAnInputError, link_new_file, read_results_file
from pytest_haico.stamps import utc_iso

_ATTEMPTS = 5


@dataclass(frozen=True)
class Holder:
    """Who holds a claim: enough to name the run and to tell whether it is dead."""

    host: str
    pid: int
    start_time: int | None  # clock ticks since boot, from /proc/<pid>/stat
    boot_id: str | None
    job: str | None  # `SlurmJob.key`: the same across requeues
    restart_count: int
    run_id: str
    claimed_at: float
    ended: tuple[str, ...] = ()  # `SlurmJob.ended_before`: jobs whose claims it may take

    @classmethod
    def current(cls, job: SlurmJob, run_id: str) -> Holder:
        pid = os.getpid()
        return cls(
            host=socket.gethostname(),
            pid=pid,
            start_time=procfs.live_start_time(pid),
            boot_id=procfs.boot_id(),
            job=job.key,
            restart_count=job.restart_count,
            run_id=run_id,
            claimed_at=time.time(),
            ended=job.ended_before,
        )

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode() + b"\n"

    @classmethod
    def parse(cls, data: bytes) -> Holder | None:
        """The holder a claim file records, or None for a file that is not a claim."""
        try:
            fields = json.loads(data)
            # Only the known fields: a later version may record more.
            holder = cls(**{name: fields[name] for name in _REQUIRED})
        except (ValueError, TypeError, KeyError):
            return None
        if not (isinstance(holder.host, str) and isinstance(holder.pid, int)):
            return None
        return holder

    def is_dead(self, me: Holder) -> bool:
        """Whether this holder is certainly not running any more, as seen from `me`."""
        if self.host == me.host:
            if self.boot_id is not None and me.boot_id is not None and self.boot_id != me.boot_id:
                return True  # the host rebooted since
            started = procfs.live_start_time(self.pid)
            if started is None:
                return True
            return self.start_time is not None and started != self.start_time  # pid reused
        if self.job is not None and self.job in me.ended:
            return True  # Slurm had ended it before `me` started
        return self.job is not None and self.job == me.job and self.restart_count < me.restart_count

    def describe(self) -> str:
        job = f", Slurm job {self.job}" if self.job else ""
        since = utc_iso(self.claimed_at)
        return f"run {self.run_id} (host {self.host}, pid {self.pid}{job}, since {since})"


_REQUIRED = tuple(name for name in Holder.__dataclass_fields__ if name != "ended")


def share_claimed(share: str, holder: Holder, path: Path) -> ShareClaimedError:
    """The refusal of a share another live run holds: who holds it and what to do."""
    return ShareClaimedError(
        f"{share} is being run by {holder.describe()}; a second run would run its items "
        f"again. Let that run finish or cancel it; if it is dead (e.g. its node failed), "
        f"remove {path}, then rerun",
        holder=holder,
        path=path,
    )


@dataclass(frozen=True)
class ShareClaim:
    """A share claim this process holds."""

    path: Path
    content: bytes

    def taken_by(self) -> str | None:
        """Who took the claim, if it is no longer this run's (a requeue of our job, or a
        continuation, broke it while we lived on); None while it is ours, or cannot be read."""
        try:
            found = read_results_file(self.path)
        except FileNotFoundError:
            # Only a run that had broken it releases it: ours can never come back.
            return (
                "a later run of this share, which took this run's claim and has released it since"
            )
        except NotAnInputError as exc:
            return f"whoever put a file there that {exc.problem}"
        except OSError:
            return None  # unreadable for now: nothing says another run holds it
        if found == self.content:
            return None
        holder = Holder.parse(found)
        return holder.describe() if holder is not None else "a file that is not a claim"

    def release(self) -> None:
        """Remove the claim if it is still ours (a run judged dead may have lost it)."""
        try:
            if read_results_file(self.path) == self.content:
                self.path.unlink()
        except (OSError, NotAnInputError):
            pass  # gone, not ours, or the file system went away: it is stale either way


def claim_share(path: Path, me: Holder, *, share: str, file_mode: int) -> ShareClaim:
    """Take the claim at `path`, breaking a stale one; `ShareClaimedError` if it is held.

    `share` names it in messages ("arm demo, shard 0/1, stratum default"). OS errors
    (a read-only or full file system) propagate, and leave no file behind.
    """
    content = me.to_json()
    for _ in range(_ATTEMPTS):
        if link_new_file(path, content, mode=file_mode):
            return ShareClaim(path, content)
        try:
            found = read_results_file(path)
        except FileNotFoundError:
            continue  # released meanwhile: try again
        except NotAnInputError as exc:
            raise ResultsError(
                f"{share}: the claim {path} {exc.problem}: remove it, then rerun"
            ) from exc
        other = Holder.parse(found)
        if other is not None and not other.is_dead(me):
            raise share_claimed(share, other, path)
        _break(path, found)
    raise ResultsError(
        f"{share}: could not take the claim {path}: other runs kept taking it; find what "
        "else runs this share (squeue, ps), then rerun"
    )


def _break(path: Path, stale: bytes) -> None:
    """Remove the stale claim `stale` at `path`, and nothing a live run took meanwhile.

    The rename moves whatever is there now; if that is not the file judged stale, a
    live run claimed it since, and it is put back.
    """
    aside = path.with_name(f".{path.name}.{socket.gethostname()}.{os.getpid()}.stale")
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return  # another run broke it first
    try:
        # Not a claim at all: put back, for the next look to name.
        with contextlib.suppress(NotAnInputError):
            if read_results_file(aside) == stale:
                return
        with contextlib.suppress(FileExistsError):  # then a third run holds it
            os.link(aside, path)
    finally:
        aside.unlink(missing_ok=True)
