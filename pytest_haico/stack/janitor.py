"""The service registry and the janitor that reaps services whose owner died.

The janitor kills and deletes, so it acts only on what it can prove is its own: a
registry file of ours (no symlink) in a private directory of ours; a process whose pid,
start time, owner uid and process group match the record (never a pid or group ≤ 1,
whose signal would reach every process we may signal); paths inside a directory the
plugin made. Anything else is left alone and named in the log.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import signal
import socket
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from pytest_haico.errors import StackError, UntrustedFileError
from pytest_haico.files import PRIVATE_FILE_MODE, make_dirs, read_owned_file, write_atomic
from pytest_haico.procfs import is_alive, iter_session, read_proc_stat, read_proc_uid
from pytest_haico.stack.ports import reap_stale_claims
from pytest_haico.stack.statedir import (
    check_private_dir,
    cleanup_problem,
    ensure_private_dir,
    remove_tree,
    resolve_state_dir,
)

logger = logging.getLogger(__name__)


class ServiceRecord(BaseModel):
    """One service in a registry file; `pid` is None between reserve and spawn."""

    model_config = ConfigDict(frozen=True)

    name: str
    pid: int | None = None
    pgid: int | None = None
    start_time: int | None = None
    uid: int | None = None  # the real uid the process runs as
    port: int | None = None
    log: str | None = None
    cleanup: tuple[str, ...] = ()


class RegistryFile(BaseModel):
    """`<state dir>/services/<owner pid>-<n>.json`, and its optional copy in a run directory."""

    version: Literal[1] = 1
    host: str
    owner_pid: int
    owner_start_time: int | None
    job: str | None = None
    tmpdir: str | None = None  # the owner's $TMPDIR, where it made its cleanup directories
    updated_at: float
    services: list[ServiceRecord]

    def owner_is_dead(self) -> bool:
        """The owner ran on this host and is gone (a pid reused since does not count)."""
        return self.host == socket.gethostname() and not is_alive(
            self.owner_pid, self.owner_start_time
        )


@dataclass(frozen=True)
class Reaped:
    """What the janitor did about one service of a dead owner."""

    record: ServiceRecord
    killed: tuple[int, ...] = ()  # pids it sent SIGKILL
    removed: tuple[Path, ...] = ()
    refused: tuple[str, ...] = ()  # what it left alone, and why


_REGISTRY_NUMBERS = itertools.count(1)


class Registry:
    """This process's record of the services it started, rewritten on every change."""

    def __init__(
        self,
        state_dir: Path | None = None,
        *,
        mirror: Path | None = None,
        mirror_mode: int = 0o640,
        job: str | None = None,
    ) -> None:
        directory = ensure_private_dir(
            resolve_state_dir(state_dir) / "services", what="the service registry directory"
        )
        # One file per registry: a process may run several stacks (one per arm, a test's
        # own), and closing one must not drop the others' records.
        self.path = directory / f"{os.getpid()}-{next(_REGISTRY_NUMBERS)}.json"
        self.mirror = mirror
        self.mirror_mode = mirror_mode
        self._mirror_failing = False  # warned once until a write succeeds again
        self._job = job
        self._tmpdir = tempfile.gettempdir()
        self._services: dict[str, ServiceRecord] = {}
        stat = read_proc_stat(os.getpid())
        self._start_time = stat.start_time if stat is not None else None

    def _flush(self) -> None:
        content = (
            RegistryFile(
                host=socket.gethostname(),
                owner_pid=os.getpid(),
                owner_start_time=self._start_time,
                job=self._job,
                tmpdir=self._tmpdir,
                updated_at=time.time(),
                services=list(self._services.values()),
            )
            .model_dump_json(indent=1)
            .encode()
        )
        write_atomic(self.path, content, mode=PRIVATE_FILE_MODE)
        if self.mirror is not None:  # a results copy: the node-local file is the janitor's
            try:
                make_dirs(self.mirror.parent, self.mirror_mode)
                write_atomic(self.mirror, content, mode=self.mirror_mode)
            except OSError as exc:  # a full results disk must not fail a service's stop
                if not self._mirror_failing:
                    logger.warning("haico: %s not updated: %s", self.mirror, exc)
                self._mirror_failing = True
            else:
                self._mirror_failing = False

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
    """The registry at `path` if it is ours, in a private directory of ours."""
    try:
        check_private_dir(path.parent, what="the registry directory", fix="not reaping it")
        return RegistryFile.model_validate_json(read_owned_file(path))
    except (StackError, UntrustedFileError) as exc:
        logger.warning("janitor: ignoring registry %s: %s", path, exc)
    except (OSError, ValidationError) as exc:
        logger.warning("janitor: ignoring unreadable registry %s: %s", path, exc)
    return None


def _refusal(record: ServiceRecord) -> str | None:
    """Why the record does not prove which process is the service's (None: it does)."""
    if record.pgid is None or record.start_time is None or record.uid is None:
        return "its record lacks the process group, start time or uid that identify it"
    if (record.pid or 0) <= 1 or record.pgid <= 1:
        return f"pid {record.pid} / process group {record.pgid} is not a service's (≤ 1)"
    if record.pgid != record.pid:
        return f"process group {record.pgid} is not the session of pid {record.pid}"
    return None


def _kill_service(record: ServiceRecord, *, timeout: float) -> tuple[list[int], str | None]:
    """SIGKILL what is provably left of the service: (the pids signalled, a refusal)."""
    if record.pid is None:
        return [], None  # never spawned
    refusal = _refusal(record)
    if refusal is not None:
        return [], refusal
    assert record.pgid is not None and record.start_time is not None
    stat = read_proc_stat(record.pid)
    if stat is not None and stat.state not in ("Z", "X"):
        if stat.start_time != record.start_time:
            return [], None  # the number was reused, so nothing of that service is left
        uid = read_proc_uid(record.pid)
        if uid != record.uid or stat.pgid != record.pgid:
            return [], (
                f"pid {record.pid} runs as uid {uid} in group {stat.pgid}, not as the "
                f"recorded uid {record.uid} in group {record.pgid}"
            )
        with contextlib.suppress(ProcessLookupError):
            os.killpg(record.pgid, signal.SIGKILL)
        victims = [record.pid]
    else:
        # The leader is gone. The kernel never reuses a number while a session of that id
        # exists, so members of session <pid> still alive are our service's stragglers.
        victims = [
            p.pid
            for p in iter_session(record.pgid)
            if p.start_time >= record.start_time and read_proc_uid(p.pid) == record.uid
        ]
        for pid in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while any(is_alive(pid) for pid in victims) and time.monotonic() < deadline:
        time.sleep(0.05)
    return victims, None


def _reap_service(record: ServiceRecord, tmpdir: Path | None, *, timeout: float) -> Reaped:
    killed, refusal = _kill_service(record, timeout=timeout)
    refused = [f"process {record.pid}: {refusal}"] if refusal is not None else []
    removed: list[Path] = []
    for leftover in map(Path, record.cleanup):
        if not os.path.lexists(leftover):
            continue
        problem: str | None = "the registry does not say where the plugin made its directories"
        if tmpdir is not None:
            problem = cleanup_problem(leftover, tmpdir)
        if problem is not None:
            refused.append(f"{leftover}: {problem}")
        elif remove_tree(leftover):
            removed.append(leftover)
        else:
            logger.warning("janitor: could not remove %s", leftover)
    for reason in refused:
        logger.warning("janitor: %s: leaving %s alone", record.name, reason)
    return Reaped(record, tuple(killed), tuple(removed), tuple(refused))


def reap_registry(path: Path, *, timeout: float = 5.0) -> list[Reaped] | None:
    """Reap the services of one registry file if its owner is dead (None: alive, or not ours)."""
    registry = _read_registry(path)
    if registry is None or not registry.owner_is_dead():
        return None
    tmpdir = Path(registry.tmpdir) if registry.tmpdir is not None else None
    reaped: list[Reaped] = []
    for record in registry.services:
        logger.warning(
            "janitor: reaping %s (pid %s, port %s) of dead owner %d",
            record.name,
            record.pid,
            record.port,
            registry.owner_pid,
        )
        reaped.append(_reap_service(record, tmpdir, timeout=timeout))
    return reaped


def reap_orphans(
    state_dir: Path | None = None,
    *,
    registries: Iterable[Path] = (),
    timeout: float = 5.0,
) -> list[Reaped]:
    """Kill the services whose owner died on this host, remove their files and stale claims.

    Reads every node-local registry under `state_dir` plus the given `registries`
    (copies in run directories, which are left in place); a live owner's services are
    never touched. Raises StackError if the state directory is not private to us.
    """
    state_dir = resolve_state_dir(state_dir)
    reaped: list[Reaped] = []
    services = state_dir / "services"
    if os.path.lexists(services):
        check_private_dir(services, what="the service registry directory")
        for path in sorted(services.glob("*.json")):
            found = reap_registry(path, timeout=timeout)
            if found is not None:
                reaped.extend(found)
                path.unlink(missing_ok=True)
    for path in registries:
        reaped.extend(reap_registry(path, timeout=timeout) or [])
    for claim in reap_stale_claims(state_dir):
        logger.info("janitor: dropped stale claim on port %d (%s)", claim.port, claim.service)
    return reaped
