"""The images' SIFs: which images the arms and cluster.env name, and pulling them by digest
inside `haico env`'s job.

The registry token is read in the job from its file (this user's, mode 0600: refused
otherwise) and handed to the one `apptainer pull` that needs it, in that process's
environment only (`APPTAINER_DOCKER_USERNAME`/`_PASSWORD`, Apptainer's own variables): never
in an argv, the submission's environment, the job's own environment or a log. Each SIF is
pulled to a temporary name in SIF_DIR and renamed into place, so a SIF that exists is whole.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from pytest_haico.config.cluster_site import ClusterSite, sif_dir_for, sif_path
from pytest_haico.config.experiment import Arm
from pytest_haico.errors import HaicoError, UntrustedFileError
from pytest_haico.files import ownership_problem, read_owned_file

USER_ENV = "APPTAINER_DOCKER_USERNAME"
TOKEN_ENV = "APPTAINER_DOCKER_PASSWORD"
# Registry credentials the job may have inherited: only the token file's reach a pull.
_CREDENTIAL_ENV = (
    USER_ENV,
    TOKEN_ENV,
    "SINGULARITY_DOCKER_USERNAME",
    "SINGULARITY_DOCKER_PASSWORD",
)
SIF_MODE = 0o644


class PullError(HaicoError):
    """An image cannot be pulled as asked; the message says what to do."""


@dataclass(frozen=True)
class Pull:
    """One image to pull: its reference pinned by digest and the SIF it becomes."""

    ref: str
    sif: Path


def images_to_pull(site: ClusterSite, arms: Iterable[Arm]) -> list[Pull]:
    """Every `docker://…@sha256:…` image cluster.env and `arms` name (Postgres, each arm's
    backend or cluster.env's, Phoenix), once each; a `.sif` path is no pull. `ConfigError`
    for an image that is not pinned by digest."""
    named = [site.postgres_image, site.backend_image, site.phoenix_image]
    named += [arm.backend.image for arm in arms]
    pulls: dict[Path, Pull] = {}
    for ref in named:
        if ref and ref.startswith("docker://"):
            sif = sif_path(ref, sif_dir_for(site, ref), source=site.source)
            pulls.setdefault(sif, Pull(ref=ref, sif=sif))
    return list(pulls.values())


def is_pulled(pull: Pull) -> bool:
    """Whether the SIF is there; `PullError` if it is there but not ours to trust."""
    try:
        info = os.lstat(pull.sif)
    except FileNotFoundError:
        return False
    problem = ownership_problem(info)
    if problem is not None:
        raise PullError(f"{pull.sif} {problem}: remove it, or point SIF_DIR elsewhere")
    return True


def read_token(path: Path) -> str:
    """The registry token in `path`: a file of this user's that only it may read or write,
    holding the token alone. `PullError` (one line) otherwise."""
    try:
        data = read_owned_file(path, private=True)
    except FileNotFoundError:
        raise PullError(
            f"REGISTRY_TOKEN_FILE={path} does not exist: write the token there (chmod 600), or "
            "remove REGISTRY_TOKEN_FILE from cluster.env for public images"
        ) from None
    except UntrustedFileError as exc:
        raise PullError(f"REGISTRY_TOKEN_FILE: {exc}") from None
    token = data.decode("utf-8", errors="replace").strip()
    if not token or "\n" in token:
        raise PullError(f"REGISTRY_TOKEN_FILE={path} must hold the token alone, on one line")
    return token


def pull_images(
    pulls: Iterable[Pull],
    *,
    token_file: Path | None,
    user: str | None,
    environ: Mapping[str, str],
    say: Callable[[str], None] = print,
) -> int:
    """Pull each missing SIF (in the job); how many were pulled. `PullError` on a failure."""
    missing = [pull for pull in pulls if not is_pulled(pull)]
    if not missing:
        return 0
    apptainer = shutil.which("apptainer", path=environ.get("PATH"))
    if apptainer is None:
        raise PullError(
            "apptainer is not on the job's PATH: load it (e.g. `module load apptainer`) "
            "before `haico env`, whose PATH the job gets"
        )
    base = {key: value for key, value in environ.items() if key not in _CREDENTIAL_ENV}
    token = read_token(token_file) if token_file is not None else None
    for pull in missing:
        _check_sif_dir(pull.sif.parent)
        partial = pull.sif.parent / f".{pull.sif.name}.{secrets.token_hex(4)}.partial"
        env = dict(base)
        if token is not None:
            env.update({USER_ENV: user or "", TOKEN_ENV: token})
        say(f"haico env: pulling {pull.ref}")
        try:
            done = subprocess.run(
                [apptainer, "pull", str(partial), pull.ref],
                env=env,
                stdin=subprocess.DEVNULL,
                check=False,
            )
        finally:
            env.clear()  # the token's only other copy
        if done.returncode != 0 or not partial.is_file():
            partial.unlink(missing_ok=True)
            raise PullError(
                f"apptainer pull {pull.ref} failed (exit {done.returncode}); its output is above"
            )
        os.chmod(partial, SIF_MODE)
        os.replace(partial, pull.sif)
        say(f"haico env: pulled {pull.sif}")
    return len(missing)


def _check_sif_dir(sif_dir: Path) -> None:
    """SIF_DIR, made if missing, and ours: a SIF another user could swap would run as us."""
    sif_dir.mkdir(parents=True, exist_ok=True)
    problem = ownership_problem(os.lstat(sif_dir))
    if problem is not None:
        raise PullError(f"SIF_DIR {sif_dir} {problem}: point SIF_DIR at a directory of yours")
