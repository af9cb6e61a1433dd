"""What a stack builder is asked for: one frozen request, read by every profile's builder."""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from pytest_haico.config.cluster_env import ClusterEnv
from pytest_haico.config.experiment import Arm
from pytest_haico.config.settings import Profile


@dataclass(frozen=True)
class BackendCommand:
    """A backend build run in place of the stand-in (`--haico-backend-cmd`): `command` split
    as a shell would (no shell runs it), `{port}` replaced, run in `directory`.

    Its environment (the contract docs/validate.md and docs/backend-api.md document):
    HAICO_BACKEND_HOST and HAICO_BACKEND_PORT (where to listen), HAICO_DATABASE_URL,
    ADMIN_DEFAULT_API_TOKEN (the admin token requests carry), VLLM_API_KEY (the model
    server's key) and HAICO_MODEL_ENDPOINT; it must answer GET /api/health with that token
    once ready.
    """

    command: str
    directory: Path


@dataclass(frozen=True)
class ModelEndpoint:
    """A model server that already runs (`--haico-model-endpoint`, a served model), and its
    key."""

    url: str
    api_key: str = field(default="", repr=False)

    @property
    def relayed(self) -> bool:
        """Whether the backend reaches it through the stack's relay (`stack.relay`): the
        HAI-Co² backend sends VLLM_API_KEY only to a host whose name contains `vllm`. Plain
        HTTP only: TLS through the relay would name the wrong host (gate
        prohibited_environment refuses such an https endpoint instead)."""
        parts = urllib.parse.urlsplit(self.url)
        return parts.scheme == "http" and "vllm" not in (parts.hostname or "")

    @property
    def host_port(self) -> tuple[str, int]:
        """The server's host and port (the scheme's default port if the URL has none)."""
        parts = urllib.parse.urlsplit(self.url)
        return parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)

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


@dataclass(frozen=True, kw_only=True)
class StackRequest:
    """The stack of one arm on its profile, and where it writes (`build_arm_stack` picks the
    profile's builder).

    A `backend_command` replaces the backend (the stand-in, or the cluster's image); a
    `model_endpoint` replaces the model server (none is started; its key is the endpoint's).
    `site`, `backend_image` and `environ` are the cluster profile's.
    """

    arm: Arm
    run_dir: Path  # logs/, services.json (the registry's mirror) and Phoenix's database
    profile: Profile = Profile.LOCAL
    site: ClusterEnv | None = None  # cluster.env
    backend_image: str | None = None  # --haico-backend-image: before the arm's and the site's
    backend_command: BackendCommand | None = None
    model_endpoint: ModelEndpoint | None = None
    log_mode: int = 0o640  # the results' file mode: the logs sit in the run directory
    state_dir: Path | None = None  # node-local state (port claims, registry); None: the default
    environ: Mapping[str, str] | None = None  # the host's environment; None: os.environ

    @property
    def log_dir(self) -> Path:
        """Where each service logs, `<name>.log`."""
        return self.run_dir / "logs"

    @property
    def registry_mirror(self) -> Path:
        """The copy of the services' registry in the run directory."""
        return self.run_dir / "services.json"
