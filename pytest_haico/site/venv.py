"""The pinned vLLM virtualenv: the lock it is built from, the marker that records what was
built, and the build itself (inside `haico env`'s job).

The requirements file is a lock: every requirement pinned (`name==version`, a direct URL),
installed with `pip install --no-deps`, so pip resolves nothing and the venv is exactly the
file. Its sha256 is the venv's identity: `<venv>/.haico-env.json` records it with the vLLM
version that importing vllm in the new venv reported, and a venv whose marker holds the
file's digest is not built again. The venv is built in place (a venv cannot move), so only a
directory haico built (its marker, or the stamp of a build cut short) is ever removed.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pytest_haico.errors import HaicoError, UntrustedFileError
from pytest_haico.files import read_owned_file, write_atomic
from pytest_haico.stamps import utc_iso

MARKER = ".haico-env.json"
PARTIAL = ".haico-env-partial"  # a build under way, or cut short
# A pinned requirement: `name[extras]==1.2` or `===`, or `name @ url`, then markers/hashes.
_PINNED = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(\[[^\]]*\])?\s*(===?\s*[^\s;,=<>!~*]+|@\s*\S+)")
# Option lines that would make the digest of this one file miss what gets installed.
_INCLUDES = ("-r", "--requirement", "-c", "--constraint", "-e", "--editable")
_VERIFY = "import json, vllm; print(json.dumps(vllm.__version__))"


class VenvError(HaicoError):
    """The vLLM venv cannot be built as asked; the message says what to do."""


@dataclass(frozen=True)
class Marker:
    """What `<venv>/.haico-env.json` records of a build."""

    requirements: str
    sha256: str
    vllm_version: str
    built_at: str
    job_id: str | None

    def describe(self) -> str:
        return f"vllm {self.vllm_version} from {self.requirements} (sha256 {self.sha256[:12]})"


def lock_digest(requirements: Path) -> str:
    """The sha256 of the lock; `VenvError` (one line) if it is missing or not a lock."""
    try:
        data = requirements.read_bytes()
    except OSError as exc:
        raise VenvError(
            f"VLLM_REQUIREMENTS={requirements}: cannot read it ({exc.strerror}); point it at "
            "the pinned requirements file in cluster.env"
        ) from None
    text = data.decode("utf-8", errors="replace").replace("\\\n", " ")
    for number, line in enumerate(text.splitlines(), start=1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        where = f"{requirements}:{number}"
        if words[0].split("=", 1)[0] in _INCLUDES:
            raise VenvError(
                f"{where}: {words[0]} includes another file, which the lock's digest would not "
                "cover: write its lines into this file"
            )
        if not words[0].startswith("-") and not _PINNED.match(line.strip()):
            raise VenvError(
                f"{where}: {words[0]!r} is not pinned (name==version): VLLM_REQUIREMENTS is "
                "installed as a lock, without resolving; generate it with `pip freeze` or "
                "`pip-compile`"
            )
    return hashlib.sha256(data).hexdigest()


def read_marker(venv: Path) -> Marker | None:
    """What the venv's marker records; None when there is none (or it is not ours, or not
    one haico wrote)."""
    try:
        fields: Any = json.loads(read_owned_file(venv / MARKER))
        return Marker(**fields)
    except (OSError, UntrustedFileError, ValueError, TypeError):
        return None


def is_built(venv: Path, digest: str) -> Marker | None:
    """The marker of `venv` when it was built from the lock of `digest`, and still has its
    interpreter; else None."""
    marker = read_marker(venv)
    if marker is None or marker.sha256 != digest or (venv / PARTIAL).exists():
        return None
    return marker if (venv / "bin" / "python").exists() else None


def check_replaceable(venv: Path) -> None:
    """`VenvError` unless `venv` is absent, empty, or one haico built (or began to)."""
    if not venv.exists() and not venv.is_symlink():
        return
    if venv.is_symlink() or not venv.is_dir():
        raise VenvError(f"VLLM_VENV={venv} is not a directory: point VLLM_VENV elsewhere")
    if any(venv.iterdir()) and read_marker(venv) is None and not (venv / PARTIAL).is_file():
        raise VenvError(
            f"VLLM_VENV={venv} exists and was not built by `haico env`: move it away, or "
            "point VLLM_VENV at a new directory"
        )


def build_venv(
    venv: Path,
    requirements: Path,
    *,
    digest: str,
    job_id: str | None,
    say: Callable[[str], None] = print,
) -> Marker:
    """Build `venv` from the lock (in the job): a new venv, `pip install --no-deps -r`, then
    `import vllm` in it; the marker last. `VenvError` naming the failed step."""
    check_replaceable(venv)
    if lock_digest(requirements) != digest:
        raise VenvError(f"{requirements} changed since `haico env` read it: run it again")
    started = time.monotonic()
    if venv.exists():
        shutil.rmtree(venv)
    venv.parent.mkdir(parents=True, exist_ok=True)
    _step([sys.executable, "-m", "venv", str(venv)], what="python -m venv")
    (venv / PARTIAL).write_text(digest + "\n")
    python = str(venv / "bin" / "python")
    pip = [python, "-m", "pip", "install", "--no-deps", "--disable-pip-version-check"]
    pip += ["--progress-bar", "off", "-q"]
    say(f"haico env: installing {requirements} (sha256 {digest[:12]}) into {venv}")
    _step([*pip, "-r", str(requirements)], what="pip install", cwd=requirements.parent)
    version = json.loads(_step([python, "-c", _VERIFY], what="import vllm", capture=True))
    marker = Marker(
        requirements=str(requirements),
        sha256=digest,
        vllm_version=str(version),
        built_at=utc_iso(),
        job_id=job_id,
    )
    write_atomic(venv / MARKER, json.dumps(asdict(marker), indent=2).encode() + b"\n", mode=0o644)
    (venv / PARTIAL).unlink()
    say(f"haico env: built {venv}: {marker.describe()} in {time.monotonic() - started:.0f} s")
    return marker


def _step(argv: list[str], *, what: str, cwd: Path | None = None, capture: bool = False) -> str:
    """Run one step of the build, its output in the job's log; its stdout if `capture`."""
    done = subprocess.run(
        argv,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE if capture else None,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise VenvError(f"{what} failed (exit {done.returncode}); its output is above")
    return done.stdout or ""
