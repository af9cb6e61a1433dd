"""Stand-in processes for the stand-ins' tests: spawned on free loopback ports, polled, stopped."""

from __future__ import annotations

import functools
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo
from psycopg.rows import dict_row

from tests.standins.standin_http import ADMIN_TOKEN, API_KEY, MODEL

READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0
# Starts on a port another process took in the meantime are retried on a new port.
PORT_ATTEMPTS = 3


class PortTakenError(Exception):
    """The stand-in could not bind: another process took its port after `free_port`."""


def free_port() -> int:
    """A loopback port that was free a moment ago (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def tail(path: Path, lines: int = 30) -> str:
    """The last lines of a log file, for failure messages."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


@dataclass
class StandinProcess:
    """One stand-in running as a real subprocess, logging into ``log_path``."""

    name: str
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    port: int
    health_path: str
    health_headers: dict[str, str] = field(default_factory=dict)
    popen: subprocess.Popen[bytes] | None = None
    sent: set[int] = field(default_factory=set)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def spawn(self) -> None:
        with self.log_path.open("ab") as log:
            self.popen = subprocess.Popen(
                self.argv,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def wait_ready(self, deadline: float) -> None:
        """Poll the health endpoint until it answers 200; fail with the log on exit or timeout."""
        assert self.popen is not None
        with httpx.Client(timeout=2.0, trust_env=False) as client:
            while True:
                code = self.popen.poll()
                if code is not None:
                    log = tail(self.log_path)
                    if "address already in use" in log:
                        raise PortTakenError(f"{self.name}: port {self.port} was taken")
                    pytest.fail(f"{self.name} exited with {code}:\n{log}")
                try:
                    url = self.base_url + self.health_path
                    if client.get(url, headers=self.health_headers).status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    self.stop()
                    pytest.fail(f"{self.name} not ready in time:\n{tail(self.log_path)}")
                time.sleep(0.05)

    def send(self, sig: int = signal.SIGTERM) -> None:
        """Send *sig* once if the process still runs (a repeated SIGINT would force it)."""
        if self.popen is not None and self.popen.poll() is None and sig not in self.sent:
            self.sent.add(sig)
            self.popen.send_signal(sig)

    def stop(self, sig: int = signal.SIGTERM) -> int | None:
        """Signal the process, wait for it, kill its group if it lingers; return its exit code."""
        if self.popen is None:
            return None
        self.send(sig)
        try:
            self.popen.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait()
        return self.popen.returncode


def wait_for_log(process: StandinProcess, text: str, timeout_s: float = 10.0) -> None:
    """Wait until *text* appears in the process's log."""
    deadline = time.monotonic() + timeout_s
    while text not in process.log_path.read_text(errors="replace"):
        if time.monotonic() > deadline:
            pytest.fail(f"{text!r} not in the log of {process.name}:\n{tail(process.log_path)}")
        time.sleep(0.02)


class Launcher:
    """Starts stand-ins in parallel, caches them by key, stops them all at the end."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self._running: dict[str, StandinProcess] = {}

    def ensure(self, specs: Mapping[str, Callable[[], StandinProcess]]) -> list[StandinProcess]:
        """The processes for *specs*' keys, starting the missing ones together."""
        fresh = {key: make() for key, make in specs.items() if key not in self._running}
        try:
            for process in fresh.values():
                process.spawn()
            deadline = time.monotonic() + READY_TIMEOUT_S
            for key in fresh:
                for attempt in range(1, PORT_ATTEMPTS + 1):
                    try:
                        fresh[key].wait_ready(deadline)
                        break
                    except PortTakenError:
                        if attempt == PORT_ATTEMPTS:
                            raise
                        fresh[key] = specs[key]()  # a new free port
                        fresh[key].spawn()
        except BaseException:
            for process in fresh.values():
                process.stop(signal.SIGKILL)
            raise
        self._running.update(fresh)
        return [self._running[key] for key in specs]

    def stop_all(self) -> None:
        """SIGTERM to all first, so their shutdowns overlap; then wait for each."""
        for process in self._running.values():
            process.send()
        for process in self._running.values():
            process.stop()


def base_env() -> dict[str, str]:
    """The environment of a stand-in: this one minus anything secret-looking or proxying."""
    drop = ("VLLM_API_KEY", "ADMIN_DEFAULT_API_TOKEN", "HAICO_DATABASE_URL", "OPENAI_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def llm_process(
    log_dir: Path,
    name: str,
    *,
    persona: str = "helpful",
    seed: int = 0,
    latency_ms: int = 0,
    tools: bool = True,
    max_model_len: int = 8192,
    api_key: str | None = API_KEY,
    replica: int = 0,
) -> StandinProcess:
    """An unstarted stand-in vLLM (*replica* only tells otherwise identical ones apart)."""
    port = free_port()
    argv = [sys.executable, "-m", "pytest_haico.standins.llm", "--model", MODEL]
    argv += ["--served-model-name", MODEL, "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--max-model-len", str(max_model_len), "--persona", persona]
    argv += ["--latency-ms", str(latency_ms), "--seed", str(seed)]
    if tools:
        argv += ["--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
    env = base_env()
    if api_key is not None:
        env["VLLM_API_KEY"] = api_key
    return StandinProcess(name, argv, env, log_dir / f"{name}.log", port, "/health")


@dataclass(frozen=True)
class LlmServer:
    """A running stand-in vLLM and how to reach it."""

    process: StandinProcess

    @property
    def base_url(self) -> str:
        return self.process.base_url

    @property
    def endpoint_url(self) -> str:
        """The endpoint as the backend is given it: a ``vllm.localhost`` name."""
        return f"http://vllm.localhost:{self.process.port}/v1"


class LlmServers:
    """Running stand-in vLLMs, one per argument set, started on first use."""

    def __init__(self, launcher: Launcher) -> None:
        self._launcher = launcher

    def __call__(self, persona: str = "helpful", **options: Any) -> LlmServer:
        """The stand-in vLLM for *persona* and *options* (see `llm_process`)."""
        (server,) = self.prefetch([(persona, options)])
        return server

    def prefetch(self, specs: Sequence[tuple[str, Mapping[str, Any]]]) -> list[LlmServer]:
        """Start several at once: their start-ups overlap."""
        log_dir = self._launcher.log_dir
        makers: dict[str, Callable[[], StandinProcess]] = {}
        for persona, options in specs:
            key = "-".join(["llm", persona, *(f"{k}={v}" for k, v in sorted(options.items()))])
            makers[key] = functools.partial(llm_process, log_dir, key, persona=persona, **options)
        return [LlmServer(p) for p in self._launcher.ensure(makers)]


def create_database(dsn: str) -> str:
    """A fresh, empty database on the server of *dsn*; returns its DSN."""
    name = "standin_" + uuid.uuid4().hex[:12]
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return make_conninfo(dsn, dbname=name)


@dataclass(frozen=True)
class BackendServer:
    """A running stand-in backend, its database and its log."""

    process: StandinProcess
    database_dsn: str

    @property
    def base_url(self) -> str:
        return self.process.base_url

    def snapshots(self, thread_id: str) -> list[dict[str, object]]:
        """The ``workspace_snapshots`` rows of a thread (or of its branches: ``thread.%``)."""
        with psycopg.connect(self.database_dsn, row_factory=dict_row) as conn:
            rows = conn.execute(
                "SELECT * FROM workspace_snapshots WHERE thread_id = %s OR thread_id LIKE %s"
                " ORDER BY created_at",
                (thread_id, thread_id + ".%"),
            ).fetchall()
        return list(rows)


class BackendServers:
    """Running stand-in backends, one per command line, each with its own database."""

    def __init__(self, launcher: Launcher, postgres_dsn: str) -> None:
        self._launcher = launcher
        self._postgres_dsn = postgres_dsn
        self._databases: dict[str, str] = {}

    def __call__(self, *args: str) -> BackendServer:
        """The stand-in backend started with *args*."""
        (server,) = self.prefetch([args])
        return server

    def prefetch(self, arg_lists: Sequence[Sequence[str]]) -> list[BackendServer]:
        """Start several at once: their start-ups overlap."""
        makers: dict[str, Callable[[], StandinProcess]] = {}
        for args in arg_lists:
            key = "-".join(["backend", *(a.strip("-") for a in args)])
            if key not in self._databases:
                self._databases[key] = create_database(self._postgres_dsn)
            log_dir = self._launcher.log_dir
            dsn = self._databases[key]
            makers[key] = functools.partial(backend_process, log_dir, key, dsn, list(args))
        processes = self._launcher.ensure(makers)
        return [BackendServer(p, self._databases[p.name]) for p in processes]


def backend_process(
    log_dir: Path, name: str, database_dsn: str, args: Sequence[str]
) -> StandinProcess:
    """An unstarted stand-in backend."""
    port = free_port()
    argv = [sys.executable, "-m", "pytest_haico.standins.backend"]
    argv += ["--host", "127.0.0.1", "--port", str(port), *args]
    env = base_env()
    env |= {
        "ADMIN_DEFAULT_API_TOKEN": ADMIN_TOKEN,
        "VLLM_API_KEY": API_KEY,
        "HAICO_DATABASE_URL": database_dsn,
    }
    return StandinProcess(
        name,
        argv,
        env,
        log_dir / f"{name}.log",
        port,
        "/api/health",
        {"Authorization": f"Bearer {ADMIN_TOKEN}"},
    )
