"""The service registry and the janitor that reaps services whose owner died."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import socket
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from pytest_haico.stack.ports import reap_stale_claims
from pytest_haico.stack.service import (
    default_state_dir,
    is_alive,
    iter_session,
    read_proc_stat,
)

logger = logging.getLogger(__name__)


class ServiceRecord(BaseModel):
    """One service in a registry file; `pid` is None between prepare and spawn."""

    model_config = ConfigDict(frozen=True)

    name: str
    pid: int | None = None
    pgid: int | None = None
    start_time: int | None = None
    port: int | None = None
    log: str | None = None
    cleanup: tuple[str, ...] = ()


class RegistryFile(BaseModel):
    """`<state dir>/services/<owner pid>.json`, and its optional copy in a run directory."""

    version: Literal[1] = 1
    host: str
    owner_pid: int
    owner_start_time: int | None
    job: str | None = None
    updated_at: float
    services: list[ServiceRecord]

    def owner_is_dead(self) -> bool:
        """The owner ran on this host and is gone (a pid reused since does not count)."""
        return self.host == socket.gethostname() and not is_alive(
            self.owner_pid, self.owner_start_time
        )


def _write_atomically(path: Path, data: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(data)
    os.replace(tmp, path)


class Registry:
    """This process's record of the services it started, rewritten on every change."""

    def __init__(
        self,
        state_dir: Path | None = None,
        *,
        mirror: Path | None = None,
        job: str | None = None,
    ) -> None:
        state_dir = state_dir if state_dir is not None else default_state_dir()
        directory = state_dir / "services"
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.path = directory / f"{os.getpid()}.json"
        self.mirror = mirror
        self._job = job
        self._services: dict[str, ServiceRecord] = {}
        stat = read_proc_stat(os.getpid())
        self._start_time = stat.start_time if stat is not None else None

    def _flush(self) -> None:
        content = RegistryFile(
            host=socket.gethostname(),
            owner_pid=os.getpid(),
            owner_start_time=self._start_time,
            job=self._job,
            updated_at=time.time(),
            services=list(self._services.values()),
        ).model_dump_json(indent=1)
        _write_atomically(self.path, content)
        if self.mirror is not None:
            self.mirror.parent.mkdir(parents=True, exist_ok=True)
            _write_atomically(self.mirror, content)

    def record(self, record: ServiceRecord) -> None:
        """Add or replace the record of `record.name`."""
        self._services[record.name] = record
        self._flush()

    def forget(self, name: str) -> None:
        """Drop a service that was stopped and cleaned up."""
        if self._services.pop(name, None) is not None:
            self._flush()

    def close(self) -> None:
        """Remove the node-local file; the mirror keeps its last state (no services)."""
        self._services.clear()
        if self.mirror is not None:
            self._flush()
        self.path.unlink(missing_ok=True)


def _read_registry(path: Path) -> RegistryFile | None:
    try:
        return RegistryFile.model_validate_json(path.read_bytes())
    except (OSError, ValidationError) as exc:
        logger.warning("janitor: ignoring unreadable registry %s: %s", path, exc)
        return None


def _kill_service(record: ServiceRecord, *, timeout: float) -> None:
    if record.pid is None or record.pgid is None:
        return
    stat = read_proc_stat(record.pid)
    if stat is not None and stat.start_time == record.start_time:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(record.pgid, signal.SIGKILL)
        victims = [record.pid]
    elif stat is None:
        # The leader is gone. The kernel never reuses a number while a session of that id
        # exists, so members of session <pid> still alive are our service's stragglers.
        since = record.start_time or 0
        victims = [p.pid for p in iter_session(record.pgid) if p.start_time >= since]
        for pid in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    else:
        return  # the number was reused, so nothing of that service is left
    deadline = time.monotonic() + timeout
    while any(is_alive(pid) for pid in victims) and time.monotonic() < deadline:
        time.sleep(0.05)


def _remove_path(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
    if path.exists():
        logger.warning("janitor: could not remove %s", path)


def reap_registry(path: Path, *, timeout: float = 5.0) -> list[ServiceRecord] | None:
    """Reap the services of one registry file if its owner is dead (None: owner alive)."""
    registry = _read_registry(path)
    if registry is None or not registry.owner_is_dead():
        return None
    for record in registry.services:
        logger.warning(
            "janitor: reaping %s (pid %s, port %s) of dead owner %d",
            record.name,
            record.pid,
            record.port,
            registry.owner_pid,
        )
        _kill_service(record, timeout=timeout)
        for leftover in record.cleanup:
            _remove_path(Path(leftover))
    return registry.services


def reap_orphans(
    state_dir: Path | None = None,
    *,
    registries: Iterable[Path] = (),
    timeout: float = 5.0,
) -> list[ServiceRecord]:
    """Kill the services whose owner died on this host, remove their files and stale claims.

    Reads every node-local registry under `state_dir` plus the given `registries`
    (copies in run directories, which are left in place); a live owner's services are
    never touched.
    """
    state_dir = state_dir if state_dir is not None else default_state_dir()
    reaped: list[ServiceRecord] = []
    for path in sorted((state_dir / "services").glob("*.json")):
        services = reap_registry(path, timeout=timeout)
        if services is not None:
            reaped.extend(services)
            path.unlink(missing_ok=True)
    for path in registries:
        reaped.extend(reap_registry(path, timeout=timeout) or [])
    for claim in reap_stale_claims(state_dir):
        logger.info("janitor: dropped stale claim on port %d (%s)", claim.port, claim.service)
    return reaped
