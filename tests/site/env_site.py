"""A scratch site for `haico env`: a project with the demo arm, a cluster.env naming a venv, a
lock, two images and a token file; a tiny real `vllm` wheel to build a venv from quickly;
the Apptainer shim on a private PATH."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_haico.site.venv import MARKER

REPO = Path(__file__).resolve().parents[2]
SHIMS = REPO / "tests" / "cluster" / "shims"
TOKEN = "haico-test-registry-token-0815"  # made up: no real token, no scanner pattern
POSTGRES_IMAGE = f"docker://postgres@sha256:{'a' * 64}"
BACKEND_IMAGE = f"docker://ghcr.io/example/haico-backend@sha256:{'b' * 64}"
FAKE_VLLM_VERSION = "0.0.1"


@dataclass
class EnvSite:
    """The project and site `haico env` is run on."""

    root: Path

    @property
    def experiments(self) -> Path:
        return self.root / "experiments"

    @property
    def cluster_env(self) -> Path:
        return self.experiments / "cluster.env"

    @property
    def work(self) -> Path:
        return self.root / "work"

    @property
    def venv(self) -> Path:
        return self.work / "vllm-venv"

    @property
    def lock(self) -> Path:
        return self.experiments / "vllm-lock.txt"

    @property
    def sif_dir(self) -> Path:
        return self.work / "sif"

    @property
    def token_file(self) -> Path:
        return self.root / "registry-token"

    @property
    def bin_dir(self) -> Path:
        return self.root / "bin"

    @property
    def pulls_log(self) -> Path:
        return self.bin_dir / "apptainer-pulls.jsonl"

    def sifs(self) -> list[Path]:
        return [
            self.sif_dir / f"postgres-sha256-{'a' * 64}.sif",
            self.sif_dir / f"haico-backend-sha256-{'b' * 64}.sif",
        ]

    def pulls(self) -> list[dict[str, Any]]:
        if not self.pulls_log.exists():
            return []
        return [json.loads(line) for line in self.pulls_log.read_text().splitlines()]

    def environ(self) -> dict[str, str]:
        """This process's environment with the shim first on PATH."""
        return {**os.environ, "PATH": f"{self.bin_dir}{os.pathsep}{os.environ['PATH']}"}

    def write_cluster_env(self, *lines: str) -> None:
        self.cluster_env.write_text("\n".join(lines) + "\n")

    def mark_venv_built(self) -> None:
        """The venv as a build from the current lock leaves it (no pip run)."""
        (self.venv / "bin").mkdir(parents=True, exist_ok=True)
        (self.venv / "bin" / "python").symlink_to(sys.executable)
        marker = {
            "requirements": str(self.lock),
            "sha256": hashlib.sha256(self.lock.read_bytes()).hexdigest(),
            "vllm_version": FAKE_VLLM_VERSION,
            "built_at": "2026-12-02T00:00:00Z",
            "job_id": None,
        }
        (self.venv / MARKER).write_text(json.dumps(marker))


def make_env_site(root: Path, *, lock_lines: tuple[str, ...] | None = None) -> EnvSite:
    """The site under `root`: the demo arm, a lock pinning the tiny wheel (or `lock_lines`),
    a cluster.env naming it all, the token file (0600), the Apptainer shim."""
    site = EnvSite(root)
    (site.experiments / "arms").mkdir(parents=True)
    shutil.copy(REPO / "experiments" / "arms" / "demo.toml", site.experiments / "arms")
    (site.experiments / "scripts").mkdir()
    site.work.mkdir()
    if lock_lines is None:
        wheel = fake_vllm_wheel(root / "wheels")
        lock_lines = (f"vllm @ {wheel.as_uri()}",)
    site.lock.write_text("\n".join(lock_lines) + "\n")
    site.token_file.write_text(TOKEN + "\n")
    site.token_file.chmod(0o600)
    site.bin_dir.mkdir()
    shutil.copy2(SHIMS / "apptainer", site.bin_dir / "apptainer")
    site.write_cluster_env(
        f"CLUSTER_WORK={site.work}",
        "VLLM_VENV=$CLUSTER_WORK/vllm-venv",
        "VLLM_REQUIREMENTS=vllm-lock.txt",
        "CPU_PARTITION=debug",
        f"POSTGRES_IMAGE={POSTGRES_IMAGE}",
        f"BACKEND_IMAGE={BACKEND_IMAGE}",
        f"REGISTRY_TOKEN_FILE={site.token_file}",
        "REGISTRY_USER=haico-bot",
    )
    return site


def fake_vllm_wheel(
    directory: Path, version: str = FAKE_VLLM_VERSION, *, init: str | None = None
) -> Path:
    """A wheel of a `vllm` package that has a version and nothing else (or `init` as its
    `__init__.py`): pip installs it in seconds, and `import vllm` in the venv answers its
    version as the real one does."""
    directory.mkdir(parents=True, exist_ok=True)
    info = f"vllm-{version}.dist-info"
    files = {
        "vllm/__init__.py": init if init is not None else f"__version__ = {version!r}\n",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: haico-tests\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    record = []
    for name, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append(f"{name},sha256={digest.decode()},{len(text.encode())}")
    record.append(f"{info}/RECORD,,")
    wheel = directory / f"vllm-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, text in {**files, f"{info}/RECORD": "\n".join(record) + "\n"}.items():
            archive.writestr(name, text)
    return wheel
