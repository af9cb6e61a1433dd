"""What one `haico env` job is to do, written by `haico env` and read back by the job: the
venv to build (and the lock's digest it was planned for), the images to pull, where the
registry token is (a path, never the token)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_haico.errors import HaicoError
from pytest_haico.files import PRIVATE_FILE_MODE, read_owned_file, write_atomic
from pytest_haico.site.images import Pull


@dataclass(frozen=True)
class VenvBuild:
    """The venv to build, from the lock whose digest `haico env` read."""

    venv: Path
    requirements: Path
    sha256: str


@dataclass(frozen=True)
class EnvPlan:
    """One job's work."""

    venv: VenvBuild | None
    pulls: tuple[Pull, ...]
    token_file: Path | None
    registry_user: str | None

    def describe(self) -> str:
        """ "builds VLLM_VENV=… and pulls 2 images into …", for the submission's line."""
        parts = []
        if self.venv is not None:
            parts.append(f"builds VLLM_VENV={self.venv.venv} from {self.venv.requirements.name}")
        if self.pulls:
            where = sorted({str(pull.sif.parent) for pull in self.pulls})
            count = len(self.pulls)
            parts.append(f"pulls {count} image{'s' if count != 1 else ''} into {', '.join(where)}")
        return " and ".join(parts)


def write_plan(path: Path, plan: EnvPlan) -> None:
    venv = plan.venv
    build = None
    if venv is not None:
        build = {"venv": str(venv.venv), "requirements": str(venv.requirements)}
        build["sha256"] = venv.sha256
    document = {
        "venv": build,
        "pulls": [{"ref": pull.ref, "sif": str(pull.sif)} for pull in plan.pulls],
        "token_file": None if plan.token_file is None else str(plan.token_file),
        "registry_user": plan.registry_user,
    }
    write_atomic(path, json.dumps(document, indent=2).encode() + b"\n", mode=PRIVATE_FILE_MODE)


def read_plan(path: Path) -> EnvPlan:
    """The plan at `path` (ours, not writable by others); `HaicoError` if it is not one."""
    try:
        document: Any = json.loads(read_owned_file(path))
        venv = document["venv"]
        return EnvPlan(
            venv=None
            if venv is None
            else VenvBuild(Path(venv["venv"]), Path(venv["requirements"]), str(venv["sha256"])),
            pulls=tuple(Pull(ref=str(p["ref"]), sif=Path(p["sif"])) for p in document["pulls"]),
            token_file=Path(document["token_file"]) if document["token_file"] else None,
            registry_user=document["registry_user"],
        )
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise HaicoError(f"{path} is no plan of `haico env` ({exc}): run haico env again") from None
