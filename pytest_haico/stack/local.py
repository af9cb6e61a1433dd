"""The local profile: Postgres, the stand-in LLM server and the stand-in backend (or a
developer's backend build, which the cluster profile runs too)."""

from __future__ import annotations

import shlex
import sys
from collections.abc import Callable

from pytest_haico.config.experiment import Arm
from pytest_haico.stack.orchestrator import Orchestrator
from pytest_haico.stack.postgres import PostgresService
from pytest_haico.stack.profiles import HttpService, Stack
from pytest_haico.stack.relay import build_relay_service
from pytest_haico.stack.request import BackendCommand, StackRequest
from pytest_haico.stack.service import Service, new_secret


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
    blank_on: str = "",
    name: str = "llm",
    start_timeout: float = 60.0,
    host: str = "127.0.0.1",
) -> HttpService:
    """The stand-in LLM server on `host`, not yet started; tool calling is on with a
    `tool_call_parser`."""

    def argv(port: int) -> list[str]:
        argv = [sys.executable, "-m", "pytest_haico.standins.llm"]
        argv += ["--model", served_name, "--served-model-name", served_name]
        argv += ["--host", host, "--port", str(port)]
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
        if blank_on:
            argv += ["--blank-on", blank_on]
        return argv

    return HttpService(
        name=name,
        argv=argv,
        env=lambda: {"VLLM_API_KEY": api_key},
        health_path="/health",
        start_timeout=start_timeout,
        secrets=(api_key,),
    )


def build_arm_llm_service(arm: Arm, *, api_key: str, host: str = "127.0.0.1") -> HttpService:
    """The stand-in LLM server that behaves as `arm`'s `[standin]` section says."""
    return build_llm_service(
        served_name=arm.served_name,
        max_model_len=arm.vllm.max_model_len,
        tool_call_parser=arm.vllm.tool_call_parser if arm.vllm.enable_tool_calling else None,
        persona=arm.standin.persona,
        latency_ms=arm.standin.latency_ms,
        seed=arm.standin.seed,
        api_key=api_key,
        load_s=arm.standin.load_s,
        max_num_seqs=arm.standin.max_num_seqs,
        blank_on=arm.standin.blank_on,
        host=host,
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


def build_local_stack(request: StackRequest) -> Stack:
    """The local profile's services for `request.arm`, not yet started; secrets go through
    the environment. The arm's `[standin]` section says how the stand-ins behave."""
    arm, model_endpoint = request.arm, request.model_endpoint
    api_key = model_endpoint.api_key if model_endpoint is not None else new_secret()
    admin_token = new_secret()
    postgres = PostgresService()
    llm = relay = None
    if model_endpoint is None:
        llm = build_arm_llm_service(arm, api_key=api_key)
    elif model_endpoint.relayed:
        relay = build_relay_service(*model_endpoint.host_port)
    model_side = (relay.name,) if relay is not None else ()

    def database_url() -> str:
        # Called at each spawn of the backend, which may come before Postgres' own: the
        # orchestrator knows the port it claimed for Postgres, and respawns the backend
        # if Postgres has to move to another one.
        return postgres.dsn_for(orchestrator.port(postgres.name), require_scram=True)

    if request.backend_command is not None:
        # A build under test may not retry its database: it starts once Postgres is healthy.
        backend = build_command_backend(
            request.backend_command,
            admin_token=admin_token,
            api_key=api_key,
            database_url=database_url,
            model_endpoint=lambda: stack.model_endpoint,
            database_secrets=postgres.secrets,
            requires=(postgres.name, *model_side),
        )
    else:
        backend = build_backend_service(
            admin_token=admin_token,
            api_key=api_key,
            database_url=database_url,
            database_secrets=postgres.secrets,
            substitute_model=arm.standin.substitute_model or None,
            rate_limit_rpm=arm.standin.rate_limit_rpm or None,
            recursion_flag=arm.standin.recursion_flag,
            # The stand-in waits for its database and answers /api/health only once it can
            # use it, so its LangGraph import (over a second) overlaps Postgres' start. A
            # real backend (the cluster profile) `requires` Postgres instead.
            waits_for=(postgres.name, *model_side),
        )
    # The LLM first: on a cluster its load is the long pole, and it overlaps Postgres' set-up.
    # Postgres' template copy runs in a worker thread while the others start.
    services: list[Service] = [s for s in (llm, relay) if s is not None]
    orchestrator = Orchestrator(
        [*services, postgres, backend],
        request.log_dir,
        state_dir=request.state_dir,
        registry_mirror=request.registry_mirror,
        log_mode=request.log_mode,
    )
    stack = Stack(
        orchestrator,
        postgres,
        llm=llm,
        backend=backend,
        api_key=api_key,
        admin_token=admin_token,
        model_endpoint=model_endpoint,
        relay=relay,
    )
    return stack
