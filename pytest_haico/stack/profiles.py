"""What both profiles assemble: services answering HTTP, and the stack they make up."""

from __future__ import annotations

import signal
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import httpx

from pytest_haico import httpclient
from pytest_haico.errors import StackError
from pytest_haico.stack.orchestrator import Orchestrator, ServiceTiming
from pytest_haico.stack.postgres import PostgresService
from pytest_haico.stack.request import ModelEndpoint
from pytest_haico.stack.service import (
    Command,
    ServiceProcess,
    inherited_env,
    provider_free_env,
)
from pytest_haico.stack.statedir import make_owned_tempdir, remove_tree


@dataclass(kw_only=True)
class HttpService:
    """A service answering HTTP on 127.0.0.1:<port>; healthy when `health_path` answers 2xx."""

    name: str
    argv: Callable[[int], Sequence[str]]
    env: Callable[[], Mapping[str, str]] = field(default=dict)
    health_path: str = "/health"
    health_headers: Mapping[str, str] = field(default_factory=dict)
    requires: tuple[str, ...] = ()
    waits_for: tuple[str, ...] = ()
    start_timeout: float | None = 60.0  # spawn to healthy; None: no deadline
    stop_signal: signal.Signals = signal.SIGTERM
    death_signal: signal.Signals | None = signal.SIGKILL
    secrets: tuple[str, ...] = ()
    cleanup_paths: tuple[Path, ...] = ()
    cwd: Path | None = None
    port_env: str | None = None  # the variable that tells the process its port, if any
    port: int | None = None
    inherit_env: bool = True  # False: `env()` is the whole environment, not an addition
    # A backend: the inherited environment without model providers' keys or tracing.
    provider_free: bool = False
    # The wait's other limit and its reports (`StartWatch`): seconds its log may stay
    # unchanged while it starts, where that is set, how often the wait logs its last line.
    stall_timeout_s: float | None = None
    stall_setting: str | None = None
    progress_every_s: float | None = None
    # The variable (TMPDIR, say) naming a private scratch directory for the process, made
    # at `reserve`, removed at `cleanup` (by the janitor if we die): what the process leaves
    # there, a killed one's sockets too, does not pile up in the shared $TMPDIR.
    scratch_env: str | None = None
    scratch_dir: Path | None = None

    @property
    def url(self) -> str:
        """The base URL, e.g. http://127.0.0.1:20001 (known once a port was assigned)."""
        if self.port is None:
            raise StackError(f"{self.name} has no port yet: start the stack first")
        return f"http://127.0.0.1:{self.port}"

    def reserve(self) -> None:
        """The scratch directory, if the service has one (`cleanup_paths` exist already)."""
        if self.scratch_env is not None and self.scratch_dir is None:
            self.scratch_dir = make_owned_tempdir(f"{self.name}-")
            self.cleanup_paths = (*self.cleanup_paths, self.scratch_dir)

    def prepare(self, log_path: Path) -> None:
        """Nothing to prepare."""

    def cancel_prepare(self) -> None:
        """Nothing to cancel."""

    def command(self, port: int) -> Command:
        """argv for `port` and the inherited environment plus `env()` (or `env()` alone)."""
        self.port = port
        env = dict(self.env())
        if self.port_env is not None:
            env[self.port_env] = str(port)
        self.reserve()
        if self.scratch_dir is not None and self.scratch_env is not None:
            env[self.scratch_env] = str(self.scratch_dir)
        inherit = provider_free_env if self.provider_free else inherited_env
        full = inherit(env) if self.inherit_env else env
        return Command(argv=list(self.argv(port)), env=full, cwd=self.cwd)

    def probe(self, port: int) -> bool:
        """One GET of the health path; a cluster's proxy settings must not apply to loopback."""
        try:
            response = httpclient.get(
                f"http://127.0.0.1:{port}{self.health_path}",
                headers=dict(self.health_headers),
                timeout=2.0,
            )
        except httpx.HTTPError:
            return False
        return response.is_success

    def on_healthy(self, port: int) -> None:
        """Nothing to set up."""

    def cleanup(self) -> None:
        """Remove the scratch directory, if any (the process has stopped)."""
        if self.scratch_dir is not None:
            if not remove_tree(self.scratch_dir):
                raise StackError(f"{self.name}: could not remove {self.scratch_dir}")
            self.cleanup_paths = tuple(p for p in self.cleanup_paths if p != self.scratch_dir)
            self.scratch_dir = None


class Stack:
    """A stack of services and what the harness needs of it: URLs, ports, logs, secrets."""

    def __init__(
        self,
        orchestrator: Orchestrator,
        postgres: PostgresService,
        *,
        llm: HttpService | None,
        backend: HttpService,
        api_key: str,
        admin_token: str,
        model_endpoint: ModelEndpoint | None = None,
        relay: HttpService | None = None,
        backend_config: Mapping[str, str] | None = None,
    ) -> None:
        self.orchestrator = orchestrator
        # The haico-owned settings the backend was given (no secret), for run-config.
        self.backend_config: Mapping[str, str] = dict(backend_config or {})
        self.postgres = postgres
        self.llm = llm
        self.external_model = model_endpoint
        self.relay = relay  # to an external model on another node (`stack.relay`)
        self.backend = backend
        self.api_key = api_key
        self.admin_token = admin_token

    def start(self) -> Stack:
        """Start every service (leak-proof: a failure stops what started, then raises)."""
        self.orchestrator.start()
        return self

    def stop(self) -> None:
        """Stop every service in reverse order, exactly once."""
        self.orchestrator.stop()

    def interrupt(self, reason: str) -> None:
        """End a `start` in progress at its next step (safe from a signal handler)."""
        self.orchestrator.interrupt(reason)

    @property
    def processes(self) -> Mapping[str, ServiceProcess]:
        """Service name → its running process."""
        return self.orchestrator.processes

    @property
    def postgres_version(self) -> str:
        return self.postgres.version

    def __enter__(self) -> Stack:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.orchestrator.__exit__(exc_type, exc, tb)

    @property
    def model_endpoint(self) -> str:
        """The OpenAI-compatible base URL the backend is given for the model."""
        if self.relay is not None:
            return f"http://vllm.localhost:{self.relay.port}/v1"
        if self.external_model is not None:
            return self.external_model.url
        assert self.llm is not None
        return f"http://vllm.localhost:{self.llm.port}/v1"

    @property
    def llm_url(self) -> str:
        """The model server's base URL as this process reaches it (127.0.0.1 for a name
        under .localhost, which Debian's resolver does not resolve by itself)."""
        if self.external_model is not None:
            return self.external_model.reachable_base_url
        assert self.llm is not None
        return self.llm.url

    @property
    def backend_url(self) -> str:
        """The backend's base URL on 127.0.0.1."""
        return self.backend.url

    @property
    def dsn(self) -> str:
        """The Postgres superuser DSN (with password)."""
        return self.postgres.dsn

    @property
    def readonly_dsn(self) -> str:
        """The read-only Postgres DSN (with password)."""
        return self.postgres.readonly_dsn

    @property
    def ports(self) -> Mapping[str, int]:
        """Service name → port."""
        return {name: p.port for name, p in self.orchestrator.processes.items()}

    @property
    def log_paths(self) -> Mapping[str, Path]:
        """Service name → log file."""
        return {s.name: self.orchestrator.log_path(s.name) for s in self.orchestrator.services}

    @property
    def timings(self) -> Mapping[str, ServiceTiming]:
        """Service name → start-up timings."""
        return self.orchestrator.timings

    @property
    def secrets(self) -> tuple[str, ...]:
        """Every secret of this stack, for redaction filters."""
        return tuple(s for s in (self.api_key, self.admin_token, *self.postgres.secrets) if s)
