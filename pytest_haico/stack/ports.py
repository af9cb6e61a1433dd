"""Loopback ports: derived from the Slurm job, probed by binding, claimed with node-local files."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import socket
import time
import zlib
from collections.abc import Mapping
from pathlib import Path

from filelock import FileLock, Timeout
from pydantic import BaseModel, ConfigDict, ValidationError

from pytest_haico.errors import StackError, UntrustedFileError
from pytest_haico.files import PRIVATE_FILE_MODE, read_owned_file, write_atomic
from pytest_haico.procfs import is_alive, read_proc_stat
from pytest_haico.stack.statedir import ensure_private_dir, resolve_state_dir

logger = logging.getLogger(__name__)

# Below the kernel's ephemeral range (32768+), so outgoing connections never take our ports.
PORT_LOW = 20000
PORT_HIGH = 32000
PORTS_PER_JOB = 8


class PortClaim(BaseModel):
    """A port claim file: `<state dir>/ports/<port>.json`."""

    model_config = ConfigDict(frozen=True)

    port: int
    host: str
    job: str
    pid: int
    pid_start_time: int | None
    service: str
    claimed_at: float

    def is_stale(self) -> bool:
        """The claiming process is gone (judged only for claims made on this host)."""
        return self.host == socket.gethostname() and not is_alive(self.pid, self.pid_start_time)


def job_label(env: Mapping[str, str] | None = None) -> str:
    """`<job>` or `<job>_<array task>` under Slurm, else `pid-<pid>`."""
    env = os.environ if env is None else env
    job = env.get("SLURM_JOB_ID")
    if not job:
        return f"pid-{os.getpid()}"
    task = env.get("SLURM_ARRAY_TASK_ID")
    return f"{job}_{task}" if task else job


def derive_base_port(
    env: Mapping[str, str] | None = None,
    *,
    low: int = PORT_LOW,
    high: int = PORT_HIGH,
    block: int = PORTS_PER_JOB,
) -> int:
    """The first port of this job's block: the same job always gets the same block."""
    env = os.environ if env is None else env
    job = env.get("SLURM_JOB_ID", "")
    task = env.get("SLURM_ARRAY_TASK_ID", "")
    if job.isdigit():
        # Job ids are sequential: consecutive jobs sharing a node get neighbouring blocks.
        key = int(job) + (int(task) if task.isdigit() else 0)
    elif job:
        key = zlib.crc32(f"{job}.{task}".encode())
    else:
        key = os.getpid()
    slots = (high - low) // block
    return low + (key % slots) * block


def is_port_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a server could bind `host:port` now (SO_REUSEADDR, as servers bind)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise
    return True


def _read_claim(path: Path) -> PortClaim | None:
    """The claim at `path`; raises UntrustedFileError if the file is not ours (a symlink,
    another's)."""
    if not os.path.lexists(path):
        return None
    try:
        return PortClaim.model_validate_json(read_owned_file(path))
    except FileNotFoundError:
        return None
    except ValidationError:
        return None  # a torn file of ours: treated as no claim, overwritten under the lock


def _claims_dir(state_dir: Path) -> Path:
    return ensure_private_dir(state_dir / "ports", what="the port claim directory")


class PortPool:
    """This session's port claims.

    Claims are files under `<state dir>/ports/`, written under a node-local file lock;
    a claim whose process is dead is stale and reclaimable.
    """

    def __init__(
        self,
        state_dir: Path | None = None,
        *,
        env: Mapping[str, str] | None = None,
        low: int = PORT_LOW,
        high: int = PORT_HIGH,
        lock_timeout: float = 30.0,
    ) -> None:
        self.state_dir = resolve_state_dir(state_dir)
        self.low = low
        self.high = high
        self.job = job_label(env)
        self.base = derive_base_port(env, low=low, high=high)
        self._lock = FileLock(self.state_dir / "ports.lock", timeout=lock_timeout)
        self._claimed: dict[int, Path] = {}
        stat = read_proc_stat(os.getpid())
        self._start_time = stat.start_time if stat is not None else None

    @property
    def claimed(self) -> tuple[int, ...]:
        """The ports this pool holds."""
        return tuple(self._claimed)

    def claim(self, service: str) -> int:
        """The first port from this job's base that is neither claimed nor bound; claims it."""
        span = self.high - self.low
        claims = _claims_dir(self.state_dir)
        try:
            with self._lock:
                for offset in range(span):
                    port = self.low + (self.base - self.low + offset) % span
                    path = claims / f"{port}.json"
                    if port in self._claimed:
                        continue
                    try:
                        existing = _read_claim(path)
                    except UntrustedFileError as exc:
                        logger.warning("skipping port %d: its claim %s", port, exc)
                        continue
                    if existing is not None and not existing.is_stale():
                        continue
                    if not is_port_free(port):
                        continue
                    claim = PortClaim(
                        port=port,
                        host=socket.gethostname(),
                        job=self.job,
                        pid=os.getpid(),
                        pid_start_time=self._start_time,
                        service=service,
                        claimed_at=time.time(),
                    )
                    write_atomic(path, claim.model_dump_json().encode(), mode=PRIVATE_FILE_MODE)
                    self._claimed[port] = path
                    logger.debug("claimed port %d for %s", port, service)
                    return port
        except Timeout as exc:
            raise StackError(
                f"could not lock {self._lock.lock_file} within {self._lock.timeout} s to claim "
                f"a port for {service}"
            ) from exc
        raise StackError(f"no free port in {self.low}-{self.high - 1} for {service}")

    def release(self, port: int) -> None:
        """Drop the claim on `port` if this pool holds it."""
        path = self._claimed.pop(port, None)
        if path is None:
            return
        with self._lock, contextlib.suppress(UntrustedFileError):
            claim = _read_claim(path)
            if claim is not None and claim.pid == os.getpid():
                path.unlink(missing_ok=True)

    def release_all(self) -> None:
        """Drop every claim of this pool."""
        for port in list(self._claimed):
            self.release(port)


def reap_stale_claims(state_dir: Path | None = None) -> list[PortClaim]:
    """Remove the claims (files of ours only) whose process is dead; returns them."""
    state_dir = resolve_state_dir(state_dir)
    claims = _claims_dir(state_dir)
    reaped: list[PortClaim] = []
    with FileLock(state_dir / "ports.lock", timeout=30.0):
        for path in claims.glob("*.json"):
            try:
                claim = _read_claim(path)
            except UntrustedFileError as exc:
                logger.warning("janitor: leaving the port claim alone: %s", exc)
                continue
            if claim is not None and claim.is_stale():
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
                reaped.append(claim)
    return reaped
