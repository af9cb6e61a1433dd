"""HTTP services and the local profile: Postgres, the stand-in LLM server and backend."""

from __future__ import annotations

import shlex
import signal
import sys
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import httpx

from pytest_haico.errors import ConfigError, StackError
from pytest_haico.stack.orchestrator import Orchestrator, ServiceTiming
from pytest_haico.stack.ports import PortPool
from pytest_haico.stack.postgres import PostgresService
from pytest_haico.stack.service import (
    Command,
    Service,
    ServiceProcess,
    inherited_env,
    new_secret,
    provider_free_env,
)


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
    start_timeout: float = 60.0
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
    progress_every_s: float | None = None  # how often the wait for it logs its log's last line

    @property
    def url(self) -> str:
        """The base URL, e.g. http://127.0.0.1:20001 (known once a port was assigned)."""
        if self.port is None:
            raise StackError(f"{self.name} has no port yet: start the stack first")
        return f"http://127.0.0.1:{self.port}"

    def reserve(self) -> None:
        """Nothing to make: `cleanup_paths`, if any, exist already."""

    def prepare(self, log_path: Path) -> None:
        """Nothing to prepare."""

    def command(self, port: int) -> Command:
        """argv for `port` and the inherited environment plus `env()` (or `env()` alone)."""
        self.port = port
        env = dict(self.env())
        if self.port_env is not None:
            env[self.port_env] = str(port)
        inherit = provider_free_env if self.provider_free else inherited_env
        full = inherit(env) if self.inherit_env else env
        return Command(argv=list(self.argv(port)), env=full, cwd=self.cwd)

    def probe(self, port: int) -> bool:
        """One GET of the health path; a cluster's proxy settings must not apply to loopback."""
        try:
            response = httpx.get(
                f"http://127.0.0.1:{port}{self.health_path}",
                headers=dict(self.health_headers),
                timeout=2.0,
                trust_env=False,
            )
        except httpx.HTTPError:
            return False
        return response.is_success

    def on_healthy(self, port: int) -> None:
        """Nothing to set up."""

    def cleanup(self) -> None:
        """Nothing to remove."""


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
        backend_config: Mapping[str, str] | None = None,
    ) -> None:
        self.orchestrator = orchestrator
        # The haico-owned settings the backend was given (no secret), for run-config.
        self.backend_config: Mapping[str, str] = dict(backend_config or {})
        self.postgres = postgres
        self.llm = llm
        self.external_model = model_endpoint
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


def build_llm_service(
    *,
    served_name: str,
    max_model_len: int,
    tool_call_parser: str | None,
    persona: str,
    latency_ms: int,
    seed: int,
    api_key: str,
    load_s: float = 0.0,
    vllm_version: str | None = None,
    max_num_seqs: int | None = None,
    name: str = "llm",
    start_timeout: float = 60.0,
) -> HttpService:
    """The stand-in LLM server, not yet started; tool calling is on with a `tool_call_parser`."""

    def argv(port: int) -> list[str]:
        argv = [sys.executable, "-m", "pytest_haico.standins.llm"]
        argv += ["--model", served_name, "--served-model-name", served_name]
        argv += ["--host", "127.0.0.1", "--port", str(port)]
        argv += ["--max-model-len", str(max_model_len)]
        if tool_call_parser is not None:
            argv += ["--enable-auto-tool-choice", "--tool-call-parser", tool_call_parser]
        argv += ["--persona", persona, "--latency-ms", str(latency_ms), "--seed", str(seed)]
        if load_s:
            argv += ["--load-s", f"{load_s:g}"]
        if vllm_version is not None:
            argv += ["--vllm-version", vllm_version]
        if max_num_seqs is not None:
            argv += ["--max-num-seqs", str(max_num_seqs)]
        return argv

    return HttpService(
        name=name,
        argv=argv,
        env=lambda: {"VLLM_API_KEY": api_key},
        health_path="/health",
        start_timeout=start_timeout,
        secrets=(api_key,),
    )


def build_backend_service(
    *,
    admin_token: str,
    api_key: str,
    database_url: Callable[[], str],
    database_secrets: tuple[str, ...] = (),
    substitute_model: str | None = None,
    rate_limit_rpm: int | None = None,
    recursion_flag: bool = True,
    name: str = "backend",
    waits_for: tuple[str, ...] = (),
    start_timeout: float = 60.0,
) -> HttpService:
    """The stand-in backend, not yet started; `database_url()` is asked at each spawn."""

    def argv(port: int) -> list[str]:
        argv = [sys.executable, "-m", "pytest_haico.standins.backend"]
        argv += ["--host", "127.0.0.1", "--port", str(port)]
        if substitute_model is not None:
            argv += ["--substitute-model", substitute_model]
        if rate_limit_rpm is not None:
            argv += ["--rate-limit-rpm", str(rate_limit_rpm)]
        if not recursion_flag:
            argv.append("--no-recursion-flag")
        return argv

    def env() -> dict[str, str]:
        return {
            "ADMIN_DEFAULT_API_TOKEN": admin_token,
            "VLLM_API_KEY": api_key,
            "HAICO_DATABASE_URL": database_url(),
        }

    return HttpService(
        name=name,
        argv=argv,
        env=env,
        health_path="/api/health",
        health_headers={"Authorization": f"Bearer {admin_token}"},
        waits_for=waits_for,
        start_timeout=start_timeout,
        secrets=(api_key, admin_token, *database_secrets),
        provider_free=True,
    )


@dataclass(frozen=True)
class BackendCommand:
    """A backend build run in place of the stand-in (`--haico-backend-cmd`): `command` split
    as a shell would (no shell runs it), `{port}` replaced, run in `directory`.

    Its environment (the contract the README documents): HAICO_BACKEND_HOST and
    HAICO_BACKEND_PORT (where to listen), HAICO_DATABASE_URL, ADMIN_DEFAULT_API_TOKEN (the
    admin token requests carry), VLLM_API_KEY (the model server's key) and
    HAICO_MODEL_ENDPOINT; it must answer GET /api/health with that token once ready.
    """

    command: str
    directory: Path


@dataclass(frozen=True)
class ModelEndpoint:
    """A model server that already runs (`--haico-model-endpoint`), and its key."""

    url: str
    api_key: str = field(default="", repr=False)

    @property
    def reachable_base_url(self) -> str:
        """The server's base URL (without /v1), with a name under .localhost as 127.0.0.1."""
        parts = urllib.parse.urlsplit(self.url)
        host = parts.hostname or ""
        netloc = parts.netloc
        if host == "localhost" or host.endswith(".localhost"):
            netloc = netloc.replace(host, "127.0.0.1", 1)
        path = parts.path.removesuffix("/").removesuffix("/v1")
        return urllib.parse.urlunsplit((parts.scheme, netloc, path, "", ""))


def build_command_backend(
    backend: BackendCommand,
    *,
    admin_token: str,
    api_key: str,
    database_url: Callable[[], str],
    model_endpoint: Callable[[], str],
    database_secrets: tuple[str, ...] = (),
    requires: tuple[str, ...] = (),
    start_timeout: float = 60.0,
) -> HttpService:
    """A developer's backend build as a service, not yet started."""
    words = shlex.split(backend.command)

    def env() -> dict[str, str]:
        return {
            "ADMIN_DEFAULT_API_TOKEN": admin_token,
            "VLLM_API_KEY": api_key,
            "HAICO_DATABASE_URL": database_url(),
            "HAICO_MODEL_ENDPOINT": model_endpoint(),
            "HAICO_BACKEND_HOST": "127.0.0.1",
        }

    return HttpService(
        name="backend",
        argv=lambda port: [word.replace("{port}", str(port)) for word in words],
        env=env,
        health_path="/api/health",
        health_headers={"Authorization": f"Bearer {admin_token}"},
        requires=requires,
        start_timeout=start_timeout,
        secrets=tuple(s for s in (api_key, admin_token, *database_secrets) if s),
        cwd=backend.directory,
        port_env="HAICO_BACKEND_PORT",
        provider_free=True,
    )


def build_local_stack(
    log_dir: Path,
    *,
    served_name: str,
    max_model_len: int,
    enable_tool_calling: bool,
    tool_call_parser: str | None,
    persona: str,
    latency_ms: int,
    seed: int,
    load_s: float = 0.0,
    substitute_model: str | None = None,
    rate_limit_rpm: int | None = None,
    recursion_flag: bool = True,
    backend_command: BackendCommand | None = None,
    model_endpoint: ModelEndpoint | None = None,
    postgres_bin_dir: Path | None = None,
    state_dir: Path | None = None,
    ports: PortPool | None = None,
    registry_mirror: Path | None = None,
    log_mode: int = 0o640,
    start_timeout: float = 60.0,
) -> Stack:
    """The local profile's services, not yet started; secrets go through the environment.

    A `backend_command` replaces the stand-in backend; a `model_endpoint` replaces the
    stand-in model server (none is started; its key is the endpoint's).
    """
    if enable_tool_calling and not tool_call_parser:
        raise ConfigError("local profile", "tool_call_parser", "required when tool calling is on")
    api_key = model_endpoint.api_key if model_endpoint is not None else new_secret()
    admin_token = new_secret()
    postgres = PostgresService(bin_dir=postgres_bin_dir)
    llm = None
    if model_endpoint is None:
        llm = build_llm_service(
            served_name=served_name,
            max_model_len=max_model_len,
            tool_call_parser=tool_call_parser if enable_tool_calling else None,
            persona=persona,
            latency_ms=latency_ms,
            seed=seed,
            api_key=api_key,
            load_s=load_s,
            start_timeout=start_timeout,
        )

    def database_url() -> str:
        # Called at each spawn of the backend, which may come before Postgres' own: the
        # orchestrator knows the port it claimed for Postgres, and respawns the backend
        # if Postgres has to move to another one.
        return postgres.dsn_for(orchestrator.port(postgres.name), require_scram=True)

    if backend_command is not None:
        # A build under test may not retry its database: it starts once Postgres is healthy.
        backend = build_command_backend(
            backend_command,
            admin_token=admin_token,
            api_key=api_key,
            database_url=database_url,
            model_endpoint=lambda: stack.model_endpoint,
            database_secrets=postgres.secrets,
            requires=(postgres.name,),
            start_timeout=start_timeout,
        )
    else:
        backend = build_backend_service(
            admin_token=admin_token,
            api_key=api_key,
            database_url=database_url,
            database_secrets=postgres.secrets,
            substitute_model=substitute_model,
            rate_limit_rpm=rate_limit_rpm,
            recursion_flag=recursion_flag,
            # The stand-in waits for its database and answers /api/health only once it can
            # use it, so its LangGraph import (over a second) overlaps Postgres' start. A
            # real backend (the cluster profile) `requires` Postgres instead.
            waits_for=(postgres.name,),
            start_timeout=start_timeout,
        )
    # The LLM first: on a cluster its load is the long pole, and it overlaps Postgres' set-up.
    # Postgres' template copy runs in a worker thread while the others start.
    services: list[Service] = [llm] if llm is not None else []
    orchestrator = Orchestrator(
        [*services, postgres, backend],
        log_dir,
        state_dir=state_dir,
        ports=ports,
        registry_mirror=registry_mirror,
        log_mode=log_mode,
    )
    stack = Stack(
        orchestrator,
        postgres,
        llm=llm,
        backend=backend,
        api_key=api_key,
        admin_token=admin_token,
        model_endpoint=model_endpoint,
    )
    return stack
