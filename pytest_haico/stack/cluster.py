"""The cluster profile: vLLM from the site's venv, Postgres and the backend from images.

* vLLM: `$VLLM_VENV/bin/vllm serve <model> --served-model-name <name> --host 127.0.0.1
  --port <port> --max-model-len <n> [--enable-auto-tool-choice --tool-call-parser <p>]
  [--tensor-parallel-size <tp>] [--data-parallel-size <dp>] [--revision <rev>]
  <extra_args>`, not containerised; its key in `VLLM_API_KEY`, never in argv; the host
  environment with the venv activated and `HF_HUB_OFFLINE=1` (a campaign never
  downloads). It is waited for while it lives and its log advances: the wait ends once
  the log has said nothing for the arm's `start_stall_timeout_s` (or at the optional
  `start_timeout_s`), and logs every 30 s what the log last said.
* Postgres: `postgres -D` in `POSTGRES_IMAGE`, through `apptainer exec` (`PostgresService`
  with an `Apptainer` launcher), data under the node-local `$TMPDIR`.
* The backend: `haico-backend --host 127.0.0.1 --port <port>` in the backend image, with the
  environment contract of `BackendCommand` plus the haico-owned `BackendConfig`, all in a
  0600 env file; a hosts file bound to /etc/hosts maps the model server's names to
  127.0.0.1. OPENAI_ENDPOINT_URL is never set (`--cleanenv` drops the host's).
* Phoenix, with PHOENIX_ENABLED=1 in cluster.env (an image backend's tracing):
  `python3 -m phoenix.server.main serve` in `PHOENIX_IMAGE`, on 127.0.0.1 (PHOENIX_HOST,
  PHOENIX_PORT; its gRPC collector, which binds every interface, on a claimed port too),
  its working directory (PHOENIX_WORKING_DIR, where `phoenix.db` is) private under the
  node-local `$TMPDIR`. The backend requires it and gets its OTLP HTTP endpoint as
  PHOENIX_COLLECTOR_ENDPOINT; at stop, once both have stopped, the database is copied to
  `<run dir>/phoenix.db` before the working directory goes.

The model endpoint is `http://vllm.localhost:<port>/v1`, as in the local profile: a name
under `.localhost` can never resolve to another machine, even where the hosts file is
missing, and its host contains `vllm` (which makes the backend use `VLLM_API_KEY`).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pytest_haico.config.cluster_site import (
    image_refs,
    resolve_cluster_site,
    sif_dir_for,
)
from pytest_haico.config.experiment import Arm
from pytest_haico.errors import ConfigError, StackError
from pytest_haico.stack.apptainer import Apptainer, ContainerHttpService, require_sif
from pytest_haico.stack.local import build_command_backend
from pytest_haico.stack.orchestrator import Orchestrator
from pytest_haico.stack.phoenix import build_phoenix_service
from pytest_haico.stack.ports import PortPool
from pytest_haico.stack.postgres import PostgresService
from pytest_haico.stack.profiles import HttpService, Stack
from pytest_haico.stack.relay import build_relay_service
from pytest_haico.stack.request import StackRequest
from pytest_haico.stack.service import Service, new_secret

logger = logging.getLogger(__name__)

MODEL_HOST = "vllm.localhost"  # the model server's name for the backend (hosts file)
BACKEND_ARGV = ("haico-backend", "--host", "127.0.0.1", "--port", "{port}")
PROGRESS_EVERY_S = 30.0
POSTGRES_START_TIMEOUT_S = 120.0  # an image's first start from a shared file system
BACKEND_START_TIMEOUT_S = 300.0  # the backend's imports, from a SIF on a shared file system
# Flags the profile sets itself: an arm's extra_args may not repeat or override them.
_OWN_FLAGS = (
    "--model",
    "--served-model-name",
    "--host",
    "--port",
    "--max-model-len",
    "--enable-auto-tool-choice",
    "--tool-call-parser",
    "--tensor-parallel-size",
    "-tp",
    "--data-parallel-size",
    "-dp",
    "--revision",
)
# Variables of the host that must not reach vLLM: the harness's Python packages (they would
# mix into the vLLM venv's interpreter), and what no service is ever given.
_NOT_FOR_VLLM = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "VLLM_API_KEY", "OPENAI_ENDPOINT_URL")
_FALLBACK_HOSTS = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"


@dataclass(frozen=True)
class BackendConfig:
    """The backend's settings that pytest-haico owns (DESIGN's recorded divergences from the
    seed): tracing only with PHOENIX_ENABLED=1 in cluster.env, the study and the per-key
    rate limiter off, the arm's max_tokens. Handed over as variables; no secret."""

    tracing: bool
    max_tokens: int

    def environment(self) -> dict[str, str]:
        """The variables the backend gets (and run-config records)."""
        return {
            "PHOENIX_ENABLED": "1" if self.tracing else "0",
            "HAICO_STUDY_ENABLED": "0",
            "HAICO_RATE_LIMIT_ENABLED": "0",
            "HAICO_MAX_TOKENS": str(self.max_tokens),
        }


def vllm_argv(arm: Arm, *, executable: Path, port: int, host: str = "127.0.0.1") -> list[str]:
    """The vLLM command line for `arm` on `host`:`port` (no secret: the key is in the
    environment). A campaign's vLLM listens on loopback; a served one (`haico serve`) on
    every interface of its node, for clients elsewhere."""
    model = arm.model.path or arm.model.hf_id
    if not model:
        raise ConfigError(
            f"arms/{arm.name}.toml",
            "model",
            "the cluster profile serves real weights: set [model] path, or hf_id and revision",
        )
    settings = arm.vllm
    argv = [str(executable), "serve", model, "--served-model-name", arm.served_name]
    argv += ["--host", host, "--port", str(port)]
    argv += ["--max-model-len", str(settings.max_model_len)]
    if settings.enable_tool_calling and settings.tool_call_parser:
        argv += ["--enable-auto-tool-choice", "--tool-call-parser", settings.tool_call_parser]
    if settings.tensor_parallel_size > 1:
        argv += ["--tensor-parallel-size", str(settings.tensor_parallel_size)]
    if settings.data_parallel_size > 1:
        argv += ["--data-parallel-size", str(settings.data_parallel_size)]
    if arm.model.hf_id and arm.model.revision:
        argv += ["--revision", arm.model.revision]
    return [*argv, *settings.extra_args]


def check_extra_args(arm: Arm) -> None:
    """Refuse extra_args that put a secret in argv or override what the profile sets."""
    for arg in arm.vllm.extra_args:
        flag = arg.split("=", 1)[0]
        if flag == "--api-key":
            problem = "--api-key would put the key in argv, which every user can read"
        elif flag in _OWN_FLAGS:
            problem = f"{flag} is set by pytest-haico from the arm's other fields"
        else:
            continue
        raise ConfigError(f"arms/{arm.name}.toml", "vllm.extra_args", f"{problem}; remove it")


def vllm_environment(
    environ: Mapping[str, str], *, venv: Path, api_key: str, hf_home: str | None
) -> dict[str, str]:
    """The host's environment (CUDA_VISIBLE_DEVICES and the site's) with the venv activated,
    the key, and the Hugging Face cache read offline."""
    env = {key: value for key, value in environ.items() if key not in _NOT_FOR_VLLM}
    path = environ.get("PATH", os.defpath)
    env.update(
        VIRTUAL_ENV=str(venv),
        PATH=f"{venv / 'bin'}{os.pathsep}{path}",
        HF_HUB_OFFLINE="1",
        VLLM_API_KEY=api_key,
    )
    if hf_home:
        env["HF_HOME"] = hf_home
    return env


def build_vllm_service(
    arm: Arm,
    *,
    venv: Path,
    api_key: str,
    environ: Mapping[str, str],
    hf_home: str | None,
    host: str = "127.0.0.1",
) -> HttpService:
    """vLLM from the venv, as an `HttpService` named `llm` (not yet started), on `host`."""
    executable = venv / "bin" / "vllm"
    if not os.access(executable, os.X_OK):
        raise StackError(
            f"llm: {executable} is not an executable: VLLM_VENV={venv} has no vLLM; build "
            "it with `haico env` or fix VLLM_VENV in cluster.env"
        )
    check_extra_args(arm)
    vllm_argv(arm, executable=executable, port=0)  # a missing model fails here, not at spawn
    env = vllm_environment(environ, venv=venv, api_key=api_key, hf_home=hf_home)
    return HttpService(
        name="llm",
        argv=lambda port: vllm_argv(arm, executable=executable, port=port, host=host),
        env=lambda: env,
        inherit_env=False,
        health_path="/health",
        start_timeout=arm.vllm.start_timeout_s,
        stall_timeout_s=arm.vllm.start_stall_timeout_s,
        stall_setting=f"[vllm] start_stall_timeout_s of arms/{arm.name}.toml",
        # vLLM's own SIGTERM handling takes its engine and GPU workers down with it.
        death_signal=signal.SIGTERM,
        # vLLM makes its processes' ZeroMQ sockets in $TMPDIR and leaves them when killed.
        scratch_env="TMPDIR",
        secrets=(api_key,),
        progress_every_s=PROGRESS_EVERY_S,
    )


def hosts_file_text() -> str:
    """The backend container's /etc/hosts: the model server's names on loopback, first (the
    first match wins), then the host's own entries."""
    try:
        base = Path("/etc/hosts").read_text(encoding="utf-8")
    except OSError:
        base = _FALLBACK_HOSTS
    own = f"# pytest-haico: the model server runs on this node\n127.0.0.1\t{MODEL_HOST} vllm\n"
    return own + base


def build_cluster_stack(request: StackRequest) -> Stack:
    """The cluster profile's services for `request.arm`, not yet started (the same `Stack`
    as the local profile's). Everything that can be checked without starting anything is
    checked here: the images' SIFs exist, apptainer is on PATH, the venv has a `vllm`.

    The backend image is `request.backend_image` (--haico-backend-image), else the arm's,
    else cluster.env's BACKEND_IMAGE; a `backend_command` runs on the host instead of an
    image; a `model_endpoint` replaces vLLM (none is started). Phoenix's database is kept
    in the run directory, with the results' file mode.
    """
    arm, site, log_mode = request.arm, request.site, request.log_mode
    backend_command, model_endpoint = request.backend_command, request.model_endpoint
    environ = os.environ if request.environ is None else request.environ
    resolved = resolve_cluster_site(site, environ)
    refs = image_refs(
        resolved,
        arm,
        backend_image=request.backend_image,
        backend_command=backend_command is not None,
    )
    found = shutil.which("apptainer", path=environ.get("PATH", os.defpath))
    if found is None:
        raise StackError(
            "apptainer is not on PATH: Postgres and the backend run from images; load it "
            "(e.g. `module load apptainer`) in the job script before pytest"
        )
    sifs = {
        name: require_sif(ref, sif_dir_for(resolved, ref), what=name, source=resolved.source)
        for name, ref in refs.items()
    }
    api_key = model_endpoint.api_key if model_endpoint is not None else new_secret()
    admin_token = new_secret()
    llm = relay = None
    if model_endpoint is not None and model_endpoint.relayed:
        relay = build_relay_service(*model_endpoint.host_port)
    model_side = (relay.name,) if relay is not None else ()
    if model_endpoint is None:
        if resolved.vllm_venv is None:
            raise ConfigError(
                resolved.source, "VLLM_VENV", "not set: the cluster profile starts vLLM from it"
            )
        llm = build_vllm_service(
            arm, venv=resolved.vllm_venv, api_key=api_key, environ=environ,
            hf_home=resolved.hf_home,
        )  # fmt: skip
    postgres = PostgresService(
        start_timeout=POSTGRES_START_TIMEOUT_S,
        launcher=Apptainer(found, sifs["postgres"], environ=dict(environ)),
    )

    def model_url() -> str:
        if relay is not None:
            return f"http://{MODEL_HOST}:{orchestrator.port(relay.name)}/v1"
        if model_endpoint is not None:
            return model_endpoint.url
        return f"http://{MODEL_HOST}:{orchestrator.port('llm')}/v1"

    config = BackendConfig(tracing=resolved.phoenix_enabled, max_tokens=arm.generation.max_tokens)
    pool = PortPool(request.state_dir)
    phoenix = None
    if "phoenix" in sifs:
        phoenix = build_phoenix_service(
            Apptainer(found, sifs["phoenix"], environ=dict(environ)),
            ports=pool,
            run_dir=request.run_dir,
            file_mode=log_mode,
        )
    backend: HttpService
    if backend_command is not None:
        backend = build_command_backend(
            backend_command,
            admin_token=admin_token,
            api_key=api_key,
            database_url=lambda: postgres.dsn_for(orchestrator.port(postgres.name)),
            model_endpoint=model_url,
            database_secrets=postgres.secrets,
            requires=(postgres.name, *model_side),
            start_timeout=BACKEND_START_TIMEOUT_S,
        )
    else:

        def backend_env() -> dict[str, str]:
            env = {
                "ADMIN_DEFAULT_API_TOKEN": admin_token,
                # A backend image's libpq may predate `require_auth`: a plain URI. It
                # connects once Postgres is healthy on this port.
                "HAICO_DATABASE_URL": postgres.dsn_for(orchestrator.port(postgres.name)),
                "HAICO_MODEL_ENDPOINT": model_url(),
                "HAICO_BACKEND_HOST": "127.0.0.1",
                **config.environment(),
            }
            if phoenix is not None:
                env["PHOENIX_COLLECTOR_ENDPOINT"] = (
                    f"http://127.0.0.1:{orchestrator.port(phoenix.name)}/v1/traces"
                )
            if api_key:
                env["VLLM_API_KEY"] = api_key
            return env

        backend = ContainerHttpService(
            name="backend",
            argv=lambda port: [word.replace("{port}", str(port)) for word in BACKEND_ARGV],
            env=backend_env,
            apptainer=Apptainer(found, sifs["backend"], environ=dict(environ)),
            hosts=hosts_file_text(),
            health_path="/api/health",
            health_headers={"Authorization": f"Bearer {admin_token}"},
            requires=(postgres.name, *model_side, *((phoenix.name,) if phoenix else ())),
            start_timeout=BACKEND_START_TIMEOUT_S,
            secrets=tuple(s for s in (api_key, admin_token, *postgres.secrets) if s),
            port_env="HAICO_BACKEND_PORT",
        )
    # The model server first: its load is the long pole, and Postgres' initdb overlaps it.
    services: list[Service] = [s for s in (llm, relay) if s is not None]
    services.append(postgres)
    if phoenix is not None:
        services.append(phoenix)
    orchestrator = Orchestrator(
        [*services, backend],
        request.log_dir,
        state_dir=request.state_dir,
        ports=pool,
        registry_mirror=request.registry_mirror,
        log_mode=log_mode,
    )
    return Stack(
        orchestrator,
        postgres,
        llm=llm,
        backend=backend,
        api_key=api_key,
        admin_token=admin_token,
        model_endpoint=model_endpoint,
        relay=relay,
        backend_config=config.environment() if backend_command is None else {},
    )
