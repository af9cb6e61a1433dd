"""What the cluster profile takes from cluster.env and the environment, and where the images'
SIFs are: cheap to import, so that the static gates can check the images before the stack
(and its import) is needed."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pytest_haico.config.cluster_env import ClusterEnv
from pytest_haico.config.experiment import Arm
from pytest_haico.errors import ConfigError

_DIGEST_REF = re.compile(r"^docker://(?P<repo>[^@\s]+)@sha256:(?P<hex>[0-9a-f]{64})$")
_NAME_CHARS = re.compile(r"[^a-z0-9._-]+")


@dataclass(frozen=True)
class ClusterSite:
    """What the cluster profile takes from cluster.env (and the environment)."""

    source: str  # the cluster.env path, for messages
    vllm_venv: Path | None
    sif_dir: Path | None
    postgres_image: str | None
    backend_image: str | None
    hf_home: str | None
    phoenix_enabled: bool
    phoenix_image: str | None = None
    work: Path | None = None  # CLUSTER_WORK
    # What `haico env` builds and pulls with (relative files are cluster.env's neighbours).
    vllm_requirements: Path | None = None
    partition: str | None = None
    cpu_partition: str | None = None
    account: str | None = None
    qos: str | None = None
    registry_token_file: Path | None = None
    registry_user: str | None = None
    gpu_min_tflops: float | None = None


def resolve_cluster_site(site: ClusterEnv | None, environ: Mapping[str, str]) -> ClusterSite:
    """cluster.env's values; VLLM_VENV, SIF_DIR and HF_HOME fall back to the environment,
    and `$CLUSTER_WORK` of the environment wins over the file's (as for the results root).
    """
    values = site.values if site is not None else {}

    def get(key: str, *, env_fallback: bool = True) -> str | None:
        return values.get(key) or (environ.get(key) if env_fallback else None) or None

    work = environ.get("CLUSTER_WORK") or values.get("CLUSTER_WORK")
    sif_dir = get("SIF_DIR") or (str(Path(work) / "sif") if work else None)
    venv = get("VLLM_VENV")
    here = site.path.parent if site is not None else Path.cwd()

    def path(key: str) -> Path | None:
        value = get(key, env_fallback=False)
        return here / value if value else None  # an absolute value stays itself

    return ClusterSite(
        source=str(site.path) if site is not None else "cluster.env",
        vllm_venv=Path(venv) if venv else None,
        sif_dir=Path(sif_dir) if sif_dir else None,
        postgres_image=get("POSTGRES_IMAGE", env_fallback=False),
        backend_image=get("BACKEND_IMAGE", env_fallback=False),
        hf_home=get("HF_HOME"),
        phoenix_enabled=get("PHOENIX_ENABLED", env_fallback=False) == "1",
        phoenix_image=get("PHOENIX_IMAGE", env_fallback=False),
        work=Path(work) if work else None,
        vllm_requirements=path("VLLM_REQUIREMENTS"),
        partition=get("PARTITION", env_fallback=False),
        cpu_partition=get("CPU_PARTITION", env_fallback=False),
        account=get("ACCOUNT", env_fallback=False),
        qos=get("QOS", env_fallback=False),
        registry_token_file=path("REGISTRY_TOKEN_FILE"),
        registry_user=get("REGISTRY_USER", env_fallback=False) or environ.get("USER") or None,
        gpu_min_tflops=_positive(get("GPU_MIN_TFLOPS", env_fallback=False), site),
    )


def _positive(value: str | None, site: ClusterEnv | None) -> float | None:
    if value is None:
        return None
    try:
        number = float(value)
    except ValueError:
        number = -1.0
    if not number > 0:
        source = str(site.path) if site is not None else "cluster.env"
        raise ConfigError(source, "GPU_MIN_TFLOPS", f"{value!r} is not a positive number")
    return number


def image_refs(
    site: ClusterSite, arm: Arm, *, backend_image: str | None = None, backend_command: bool = False
) -> dict[str, str]:
    """Service name → the image reference it runs from: Postgres' always, the backend's
    unless a command replaces it (`backend_image` is --haico-backend-image, else the arm's,
    else cluster.env's), and Phoenix's when PHOENIX_ENABLED=1 turns the backend image's
    tracing on (a command's environment has no tracing settings). Raises ConfigError if
    one is not set."""
    images = {"postgres": _required(site.postgres_image, site, "POSTGRES_IMAGE", "Postgres")}
    if not backend_command:
        chosen = backend_image or arm.backend.image or site.backend_image
        images["backend"] = _required(chosen, site, "BACKEND_IMAGE", "the backend")
        if site.phoenix_enabled:
            images["phoenix"] = _required(
                site.phoenix_image, site, "PHOENIX_IMAGE", "Phoenix", needed_by="PHOENIX_ENABLED=1"
            )
    return images


def image_sifs(
    site: ClusterSite, arm: Arm, *, backend_image: str | None = None, backend_command: bool = False
) -> dict[str, Path]:
    """Service name → the SIF it runs from, existing or not (gate 8 `images` checks them).
    Raises ConfigError if an image is not set or not pinned by digest."""
    refs = image_refs(site, arm, backend_image=backend_image, backend_command=backend_command)
    return {
        name: sif_path(ref, sif_dir_for(site, ref), source=site.source)
        for name, ref in refs.items()
    }


def sif_dir_for(site: ClusterSite, ref: str) -> Path:
    """Where the SIF of `ref` lives (a `.sif` path is absolute: any directory will do)."""
    if site.sif_dir is None and ref.startswith("docker://"):
        raise ConfigError(
            site.source, "SIF_DIR", "not set, nor CLUSTER_WORK: no place for the images' SIFs"
        )
    return site.sif_dir or Path("/")


def _required(
    value: str | None,
    site: ClusterSite,
    key: str,
    what: str,
    *,
    needed_by: str = "the cluster profile",
) -> str:
    if not value:
        raise ConfigError(
            site.source,
            key,
            f"required by {needed_by}: {what}'s image pinned by digest "
            "(docker://<repo>@sha256:<64 hex>) or the absolute path of a .sif",
        )
    return value


def sif_path(image: str, sif_dir: Path, *, source: str = "cluster.env") -> Path:
    """The SIF file an image reference runs from.

    `docker://<repo>@sha256:<hex>` (pinned by digest) → `<sif_dir>/<name>-sha256-<hex>.sif`;
    an absolute path ending in `.sif` is that file. Anything else (a tag, a relative path)
    is a `ConfigError`: a tag names different images over time.
    """
    match = _DIGEST_REF.match(image)
    if match is not None:
        name = _NAME_CHARS.sub("-", match["repo"].rsplit("/", 1)[-1].split(":")[0].lower())
        return sif_dir / f"{name.strip('-') or 'image'}-sha256-{match['hex']}.sif"
    if image.endswith(".sif") and Path(image).is_absolute():
        return Path(image)
    raise ConfigError(
        source,
        "image",
        f"{image!r} is neither pinned by digest (docker://<repo>@sha256:<64 hex>) nor an "
        "absolute path to a .sif file",
    )
