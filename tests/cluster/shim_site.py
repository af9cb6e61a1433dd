"""A scratch cluster site for the cluster profile's tests: CLUSTER_WORK with fake SIFs, a
VLLM_VENV whose `bin/vllm` is the vLLM shim, a bin directory with the Apptainer shim (and
the Phoenix shim, which the Phoenix image's `python3` runs), and cluster.env naming them
(PHOENIX_IMAGE too, but not PHOENIX_ENABLED): a module, not fixtures
(tests/cluster/conftest.py makes one)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_haico.config.cluster_env import ClusterEnv, load_cluster_env
from pytest_haico.config.experiment import Arm
from pytest_haico.config.settings import Profile
from pytest_haico.stack.postgres import find_postgres_binaries
from pytest_haico.stack.request import StackRequest
from tests.gates.conftest import make_vllm_venv

SHIMS = Path(__file__).with_name("shims")
POSTGRES_DIGEST = "1" * 64
BACKEND_DIGEST = "2" * 64
POSTGRES_IMAGE = f"docker://postgres@sha256:{POSTGRES_DIGEST}"
BACKEND_IMAGE = f"docker://ghcr.io/example/haico-backend@sha256:{BACKEND_DIGEST}"
PHOENIX_DIGEST = "3" * 64
PHOENIX_IMAGE = f"docker://arizephoenix/phoenix@sha256:{PHOENIX_DIGEST}"
# The official Postgres image's own variables (PGDATA too: `postgres -D` must win over it).
POSTGRES_IMAGE_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "PGDATA": "/var/lib/postgresql/data",
    "LANG": "en_US.utf8",
}
BACKEND_IMAGE_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
# The Phoenix image's own (its Dockerfile's ENV lines).
PHOENIX_IMAGE_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin:/phoenix/.venv/bin",
    "PYTHONPATH": "/phoenix/.venv/lib/python3.13/site-packages:",
    "PYTHONUNBUFFERED": "1",
}
# Set in the host environment the stack is built from: none may reach a container.
HOST_SECRET = "sk-host-secret-that-must-stay-on-the-host"
HOST_ONLY = {
    "OPENAI_API_KEY": HOST_SECRET,
    "OPENAI_ENDPOINT_URL": "https://api.example.com/v1",
    "APPTAINERENV_OPENAI_API_KEY": HOST_SECRET,
}

ARM = Arm.model_validate(
    {
        "name": "qwen32b",
        "model": {"path": "/models/Qwen2.5-32B-Instruct", "served_name": "qwen32b"},
        "vllm": {
            "tensor_parallel_size": 2,
            "max_model_len": 32768,
            "tool_call_parser": "hermes",
            "extra_args": ["--gpu-memory-utilization", "0.92"],
        },
        "generation": {"max_tokens": 4096},
        "run": {"turn_timeout_s": 60},
    }
)


@dataclass
class ShimSite:
    """The scratch site: what `build_cluster_stack` is given, and where things are."""

    root: Path
    cluster_env: ClusterEnv
    environ: dict[str, str]
    venv: Path
    bin_dir: Path

    @property
    def sif_dir(self) -> Path:
        return self.root / "work" / "sif"

    def stack_request(
        self,
        run_dir: Path,
        *,
        arm: Arm = ARM,
        site: ClusterEnv | None = None,
        environ: Mapping[str, str] | None = None,
        **options: Any,
    ) -> StackRequest:
        """The cluster profile's stack for `arm` on this site (or `site`), in `run_dir`."""
        return StackRequest(
            arm=arm,
            run_dir=run_dir,
            profile=Profile.CLUSTER,
            site=self.cluster_env if site is None else site,
            environ=self.environ if environ is None else environ,
            **options,
        )

    def configure_vllm(self, **options: Any) -> None:
        """Rewrite the vLLM shim's configuration (persona, load_s, load_lines, ...)."""
        config = {"python": sys.executable, "persona": "helpful", **options}
        (self.venv / "haico-shim.json").write_text(json.dumps(config))


def make_shim_site(root: Path, *, cluster_env_lines: tuple[str, ...] = ()) -> ShimSite:
    """A site under `root`, which must be reachable by every user (Postgres runs as another
    user when the tests run as root: it reads its image and runs the shims)."""
    work = root / "work"
    sif_dir = work / "sif"
    sif_dir.mkdir(parents=True)
    bin_dir = root / "bin"
    bin_dir.mkdir()
    shutil.copy2(SHIMS / "apptainer", bin_dir / "apptainer")
    shutil.copy2(SHIMS / "phoenix", bin_dir / "phoenix")
    # The shims' `#!/usr/bin/env python3` finds this one first: pyenv's shim of the same
    # name costs half a second per start. (Another user is refused it and goes on along
    # PATH to the system's python3.)
    (bin_dir / "python3").symlink_to(sys.executable)
    venv = make_vllm_venv(work / "vllm-venv", executable=False)
    (venv / "bin").mkdir()
    shutil.copy2(SHIMS / "vllm", venv / "bin" / "vllm")
    pg_bin = find_postgres_binaries().bin_dir
    _write_sif(
        sif_dir / f"postgres-sha256-{POSTGRES_DIGEST}.sif",
        programs={name: [str(pg_bin / name)] for name in ("postgres", "initdb", "pg_dump")},
        env=POSTGRES_IMAGE_ENV,
    )
    _write_sif(
        sif_dir / f"haico-backend-sha256-{BACKEND_DIGEST}.sif",
        programs={"haico-backend": [sys.executable, "-m", "pytest_haico.standins.backend"]},
        env=BACKEND_IMAGE_ENV,
        binds_required=["/etc/hosts"],
        hosts_must_map=["vllm.localhost", "vllm"],
    )
    _write_sif(
        sif_dir / f"phoenix-sha256-{PHOENIX_DIGEST}.sif",
        # The image's PYTHONPATH would mix into this interpreter: the shim gets -I.
        programs={"python3": [sys.executable, "-I", str(bin_dir / "phoenix")]},
        env=PHOENIX_IMAGE_ENV,
    )
    lines = [
        f"CLUSTER_WORK={work}",
        "VLLM_VENV=$CLUSTER_WORK/vllm-venv",
        f"POSTGRES_IMAGE={POSTGRES_IMAGE}",
        f"BACKEND_IMAGE={BACKEND_IMAGE}",
        f"PHOENIX_IMAGE={PHOENIX_IMAGE}",
        f"HF_HOME={work / 'hf'}",
        *cluster_env_lines,
    ]
    path = root / "cluster.env"
    path.write_text("\n".join(lines) + "\n")
    environ = {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', os.defpath)}",
        "HOME": os.environ.get("HOME", "/root"),
        "LANG": "C.UTF-8",
        "CUDA_VISIBLE_DEVICES": "0,1",
        "TMPDIR": tempfile.gettempdir(),
        **HOST_ONLY,
    }
    site = ShimSite(root, load_cluster_env(path), environ, venv, bin_dir)
    site.configure_vllm()
    return site


@contextlib.contextmanager
def scratch_site(*, cluster_env_lines: tuple[str, ...] = ()) -> Iterator[ShimSite]:
    """`make_shim_site` in a fresh directory under $TMPDIR, removed afterwards.

    Not under pytest's tmp_path (mode 0700): Postgres runs as another user under root and
    must reach its image and the shims, as on a cluster where everything is the user's.
    """
    root = Path(tempfile.mkdtemp(prefix="haico-cluster-site-"))
    os.chmod(root, 0o755)
    try:
        yield make_shim_site(root, cluster_env_lines=cluster_env_lines)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _write_sif(path: Path, **content: Any) -> None:
    path.write_text(json.dumps({"fake_sif": 1, **content}, indent=1))
    path.chmod(0o644)
