"""Stand-ins for their own tests: the local profile's services, run by the orchestrator."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import signal
import socket
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import dict_row

from pytest_haico.stack import HttpService, Orchestrator, ServiceProcess
from pytest_haico.stack.local import build_backend_service, build_llm_service
from tests.polling import wait_for
from tests.standins.standin_http import ADMIN_TOKEN, API_KEY, MODEL


def free_port() -> int:
    """A loopback port that was free a moment ago (the kernel picks it): nothing answers there."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def base_env() -> dict[str, str]:
    """For running a stand-in's command line directly: this environment minus its secrets."""
    drop = ("VLLM_API_KEY", "ADMIN_DEFAULT_API_TOKEN", "HAICO_DATABASE_URL", "OPENAI_")
    return {k: v for k, v in os.environ.items() if not k.startswith(drop)}


def wait_for_log(log_path: Path, text: str, *, timeout: float = 10.0) -> None:
    """Wait until *text* appears in the log at *log_path*."""
    wait_for(
        lambda: text in log_path.read_text(errors="replace"),
        timeout=timeout,
        what=f"{text!r} in {log_path}",
    )


def _changed(spec: Any) -> list[str]:
    """``field=value`` for each optional field of the dataclass *spec* not at its default."""
    return [
        f"{f.name}={getattr(value, 'name', value)}"  # a signal by its name
        for f in dataclasses.fields(spec)
        if f.default is not dataclasses.MISSING and (value := getattr(spec, f.name)) != f.default
    ]


@dataclass(frozen=True)
class LlmSpec:
    """A stand-in vLLM's arguments (*replica* only tells otherwise identical ones apart)."""

    persona: str
    seed: int = 0
    latency_ms: int = 0
    tools: bool = True
    max_model_len: int = 8192
    api_key: str = API_KEY
    vllm_version: str | None = None
    max_num_seqs: int | None = None
    stop_signal: signal.Signals = signal.SIGTERM
    replica: int = 0

    @property
    def name(self) -> str:
        """The service's (and its log's) name, one per argument set: ``llm-flaky-seed=1``."""
        return "-".join(["llm", self.persona, *_changed(self)])

    def build(self) -> HttpService:
        service = build_llm_service(
            served_name=MODEL,
            max_model_len=self.max_model_len,
            tool_call_parser="hermes" if self.tools else None,
            persona=self.persona,
            latency_ms=self.latency_ms,
            seed=self.seed,
            api_key=self.api_key,
            vllm_version=self.vllm_version,
            max_num_seqs=self.max_num_seqs,
            name=self.name,
        )
        return dataclasses.replace(service, stop_signal=self.stop_signal)


@dataclass(frozen=True)
class BackendSpec:
    """A stand-in backend's arguments (*replica* only tells otherwise identical ones apart)."""

    substitute_model: str | None = None
    rate_limit_rpm: int | None = None
    recursion_flag: bool = True
    stop_signal: signal.Signals = signal.SIGTERM
    replica: int = 0

    @property
    def name(self) -> str:
        """The service's (and its log's) name, one per argument set: ``backend-replica=1``."""
        return "-".join(["backend", *_changed(self)])

    def build(self, database_dsn: str) -> HttpService:
        service = build_backend_service(
            admin_token=ADMIN_TOKEN,
            api_key=API_KEY,
            database_url=lambda: database_dsn,
            database_secrets=(str(conninfo_to_dict(database_dsn)["password"]),),
            substitute_model=self.substitute_model,
            rate_limit_rpm=self.rate_limit_rpm,
            recursion_flag=self.recursion_flag,
            name=self.name,
        )
        return dataclasses.replace(service, stop_signal=self.stop_signal)


class Launcher:
    """Running stand-ins by name: each batch started by an orchestrator, all stopped at the end."""

    def __init__(self, log_dir: Path, state_dir: Path) -> None:
        self.log_dir = log_dir
        # Not the default state directory: the orchestrators of one process share its registry
        # file, each rewriting it with only its own services, and ours would drop the record
        # of the session's Postgres (whose data directory the janitor must find).
        self._state_dir = state_dir
        self._orchestrators = contextlib.ExitStack()
        self._running: dict[str, ServiceProcess] = {}

    def ensure(self, makers: Mapping[str, Callable[[], HttpService]]) -> dict[str, ServiceProcess]:
        """The processes of *makers*' names; the missing ones are started together."""
        missing = [make() for name, make in makers.items() if name not in self._running]
        if missing:
            orchestrator = Orchestrator(missing, self.log_dir, state_dir=self._state_dir)
            self._orchestrators.enter_context(orchestrator)  # stops what started if one fails
            self._running.update(orchestrator.processes)
        return {name: self._running[name] for name in makers}

    def stop_all(self) -> None:
        """Stop every batch, the last one first, each as its orchestrator does."""
        # Signalled all at once first, so that their shutdowns overlap: an orchestrator stops
        # one process after the other. Its own signal that follows at most cuts a stand-in's
        # grace period short (a second SIGINT does); a process not yet reaped keeps its pid.
        for process in self._running.values():
            if process.pid is not None and process.exit_status() is None:
                os.kill(process.pid, process.service.stop_signal)
        self._orchestrators.close()


@dataclass(frozen=True)
class StandinServer:
    """A running stand-in: its process, port and log."""

    process: ServiceProcess

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.process.port}"

    def stop(self) -> int | None:
        """Stop it now, as the orchestrator would (its stop signal first); its exit status."""
        self.process.stop()
        return self.process.exit_status()


@dataclass(frozen=True)
class LlmServer(StandinServer):
    """A running stand-in vLLM."""

    @property
    def endpoint_url(self) -> str:
        """The endpoint as the backend is given it: a ``vllm.localhost`` name."""
        return f"http://vllm.localhost:{self.process.port}/v1"


class LlmServers:
    """Running stand-in vLLMs, one per argument set, started on first use."""

    def __init__(self, launcher: Launcher) -> None:
        self._launcher = launcher

    def __call__(self, persona: str = "helpful", **options: Any) -> LlmServer:
        """The stand-in vLLM for *persona* and *options* (see `LlmSpec`)."""
        (server,) = self.prefetch([(persona, options)])
        return server

    def prefetch(self, specs: Sequence[tuple[str, Mapping[str, Any]]]) -> list[LlmServer]:
        """Start several at once: their start-ups overlap."""
        llm_specs = [LlmSpec(persona, **options) for persona, options in specs]
        running = self._launcher.ensure({spec.name: spec.build for spec in llm_specs})
        return [LlmServer(running[spec.name]) for spec in llm_specs]


def create_database(dsn: str) -> str:
    """A fresh, empty database on the server of *dsn*; returns its DSN."""
    name = "standin_" + uuid.uuid4().hex[:12]
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return make_conninfo(dsn, dbname=name)


@dataclass(frozen=True)
class BackendServer(StandinServer):
    """A running stand-in backend and its database."""

    database_dsn: str

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
    """Running stand-in backends, one per argument set, each with its own fresh database."""

    def __init__(self, launcher: Launcher, postgres_dsn: str) -> None:
        self._launcher = launcher
        self._postgres_dsn = postgres_dsn
        self._databases: dict[str, str] = {}

    def __call__(self, **options: Any) -> BackendServer:
        """The stand-in backend for *options* (see `BackendSpec`)."""
        (server,) = self.prefetch([options])
        return server

    def prefetch(self, option_sets: Sequence[Mapping[str, Any]]) -> list[BackendServer]:
        """Start several at once: their start-ups overlap."""
        specs = [BackendSpec(**options) for options in option_sets]
        running = self._launcher.ensure({s.name: functools.partial(self._build, s) for s in specs})
        return [BackendServer(running[s.name], self._databases[s.name]) for s in specs]

    def _build(self, spec: BackendSpec) -> HttpService:
        self._databases[spec.name] = create_database(self._postgres_dsn)
        return spec.build(self._databases[spec.name])
