"""Builders shared by the stack tests (a module, not fixtures)."""

from __future__ import annotations

import contextlib
import os
import pwd
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from pytest_haico.procfs import read_proc_stat
from pytest_haico.stack import HttpService, ServiceRecord
from pytest_haico.stack.janitor import RegistryFile

TINY_SERVICE = Path(__file__).with_name("tiny_service.py")
STACK_OWNER = Path(__file__).with_name("stack_owner.py")


def tiny(
    name: str = "web",
    *,
    mode: str = "ok",
    requires: tuple[str, ...] = (),
    start_timeout: float = 15.0,
    death_signal: signal.Signals | None = signal.SIGKILL,
    token: str | None = None,
    cleanup_paths: tuple[Path, ...] = (),
    argv_hook: Callable[[int], None] | None = None,
) -> HttpService:
    """A tiny_service.py service; `token` goes through its environment and its probe header."""

    def argv(port: int) -> list[str]:
        if argv_hook is not None:
            argv_hook(port)
        return [sys.executable, str(TINY_SERVICE), "--port", str(port), "--mode", mode]

    env: Mapping[str, str] = {"TINY_TOKEN": token} if token else {}
    headers: Mapping[str, str] = {"Authorization": f"Bearer {token}"} if token else {}
    return HttpService(
        name=name,
        argv=argv,
        env=lambda: env,
        health_headers=headers,
        requires=requires,
        start_timeout=start_timeout,
        death_signal=death_signal,
        secrets=(token,) if token else (),
        cleanup_paths=cleanup_paths,
    )


def dead_pid() -> int:
    """The pid of a process that has just exited."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    return dead.pid


@contextlib.contextmanager
def victim() -> Iterator[subprocess.Popen[bytes]]:
    """A process in its own session (pid = process group) that a bad janitor would kill."""
    process = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True
    )
    try:
        yield process
    finally:
        process.kill()
        process.wait()


def record_of(process: subprocess.Popen[bytes], name: str = "llm", **fields: Any) -> ServiceRecord:
    """The record a live owner would have written for `process`; `fields` override."""
    stat = read_proc_stat(process.pid)
    assert stat is not None
    values: dict[str, Any] = {
        "name": name,
        "pid": process.pid,
        "pgid": process.pid,
        "start_time": stat.start_time,
        "uid": os.getuid(),
    }
    return ServiceRecord(**{**values, **fields})


def write_registry(path: Path, records: list[ServiceRecord], *, tmpdir: str | None = None) -> Path:
    """A registry file of a dead owner on this host, naming `records`."""
    registry = RegistryFile(
        host=socket.gethostname(),
        owner_pid=dead_pid(),
        owner_start_time=None,
        tmpdir=tmpdir if tmpdir is not None else tempfile.gettempdir(),
        updated_at=time.time(),
        services=records,
    )
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.write_text(registry.model_dump_json())
    return path


def give_to_nobody(*paths: Path, mode: int | None = None) -> None:
    """chown to nobody (root only), as if another user had made them; `mode` for each."""
    nobody = pwd.getpwnam("nobody")
    for path in paths:
        os.chown(path, nobody.pw_uid, nobody.pw_gid, follow_symlinks=False)
        if mode is not None:
            os.chmod(path, mode)


needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="only root can make files owned by another user"
)
