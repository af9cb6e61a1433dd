"""What makes two items the same experiment: model, backend and item identities."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_haico import __version__
from pytest_haico.config.experiment import Arm, Script
from pytest_haico.config.settings import Profile

# What identifies a SIF build cheaply: its global header (the build's UUID, creation time)
# and its descriptors are at its start.
SIF_HEADER_BYTES = 64 * 1024

# Sharded checkpoints name their shards in an index; single-file ones have none.
SHARD_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")


def model_identity(arm: Arm, *, profile: Profile, endpoint: str | None = None) -> str:
    """The weights that answer: hashes of config.json and the shard index, or HF id + revision."""
    if endpoint:
        return f"endpoint:{endpoint};served_name:{arm.served_name}"
    if profile is Profile.LOCAL:
        # max_num_seqs schedules the replies, it does not change them.
        standin = arm.standin.model_dump(mode="json", exclude={"max_num_seqs"})
        if not standin["blank_on"]:  # off: the identity stays what it was before the key
            del standin["blank_on"]
        return "standin:" + _canonical(standin)
    if arm.model.hf_id:
        return f"hf:{arm.model.hf_id}@{arm.model.revision or 'unpinned'}"
    if arm.model.path:
        directory = Path(arm.model.path)
        parts = [f"path:{directory}", f"config.json:{_file_sha256(directory / 'config.json')}"]
        index = next((directory / n for n in SHARD_INDEXES if (directory / n).is_file()), None)
        if index is not None:
            parts.append(f"{index.name}:{_file_sha256(index)}")
        else:
            weights = sorted(directory.glob("*.safetensors")) + sorted(directory.glob("*.bin"))
            parts.append("weights:" + ",".join(f"{w.name}={w.stat().st_size}" for w in weights))
        return ";".join(parts)
    return "unspecified"


@dataclass(frozen=True)
class SourceTree:
    """The git state of the directory a backend command runs in: which build it runs."""

    directory: Path
    commit: str | None  # None: not a git checkout (or git is missing)
    dirty: bool = False
    diff_sha256: str | None = None  # of `git diff HEAD`, when tracked files changed

    @property
    def identity(self) -> str:
        if self.commit is None:
            return "git:none"
        if not self.dirty:
            return f"git:{self.commit}"
        return f"git:{self.commit}+dirty:{self.diff_sha256 or 'untracked-only'}"

    def note(self) -> str | None:
        """What a user should know when builds of this tree cannot all be told apart."""
        if self.commit is None:
            return (
                f"--haico-backend-cmd runs in {self.directory}, which is not a git checkout: "
                "every build run from it shares item ids (commit the build to tell them apart)"
            )
        if self.dirty:
            return (
                f"--haico-backend-cmd runs in {self.directory}, a dirty tree at commit "
                f"{self.commit[:12]}: its identity hashes `git diff HEAD`, so builds that "
                "differ only in untracked files share item ids"
            )
        return None


def source_tree(directory: Path) -> SourceTree:
    """Read `directory`'s git commit and whether (and how) its tracked files changed."""

    def git(*args: str) -> bytes | None:
        try:
            result = subprocess.run(
                ["git", "-C", str(directory), *args],
                capture_output=True,
                timeout=30,
                check=False,
                env={**os.environ, "GIT_OPTIONAL_LOCKS": "0"},
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        return result.stdout if result.returncode == 0 else None

    head = git("rev-parse", "HEAD")
    if head is None:
        return SourceTree(directory, None)
    status = git("status", "--porcelain") or b""
    if not status.strip():
        return SourceTree(directory, head.decode().strip())
    diff = git("diff", "HEAD", "--binary") or b""
    digest = hashlib.sha256(diff).hexdigest() if diff else None
    return SourceTree(directory, head.decode().strip(), dirty=True, diff_sha256=digest)


def backend_identity(
    arm: Arm,
    *,
    profile: Profile,
    image: str | None = None,
    command: str | None = None,
    tree: SourceTree | None = None,
    site_image: str | None = None,
) -> str:
    """The backend build: a command (and the tree it runs in), else on the cluster profile an
    image (this run's, the arm's, the site's), else the local profile's stand-in."""
    if command:
        return f"cmd:{command};{tree.identity if tree is not None else 'git:none'}"
    if profile is Profile.CLUSTER:
        chosen = image or arm.backend.image or site_image
        if not chosen:
            return "unspecified"
        if chosen.endswith(".sif") and Path(chosen).is_absolute():
            # A path names whatever was last built there: the file's header tells builds
            # apart (a SIF's header holds its build's UUID and creation time).
            return f"image:{chosen};header:{_header_sha256(Path(chosen))}"
        return f"image:{chosen}"  # pinned by digest
    return f"standin:pytest_haico.standins.backend@{__version__}"  # images: cluster only


def arm_settings(arm: Arm) -> dict[str, dict[str, Any]]:
    """The arm's result-relevant settings as its items' identity hashes them: the resolved
    `model` (with the served name), `vllm`, `generation` and `agent` sections."""
    settings: dict[str, dict[str, Any]] = arm.model_dump(mode="json", include=_SETTINGS)
    settings["model"]["served_name"] = arm.served_name
    return settings


_SETTINGS = {"model", "vllm", "generation", "agent"}


def item_id(arm: Arm, script: Script, repeat: int, *, model: str, backend: str) -> str:
    """sha256 of the canonical projection of everything that determines the item's result.

    Tags, stratum, description and the repeat count are left out: re-tagging a script
    or adding repeats keeps the ids of the items that already ran. Expectations a turn
    does not set are left out too, so a new expectation key keeps every existing id.
    """
    projection = {
        "turns": [turn.model_dump(mode="json", exclude_none=True) for turn in script.turns],
        "repeat": repeat,
        "arm": arm_settings(arm),
        "model_identity": model,
        "backend_identity": backend,
    }
    return hashlib.sha256(_canonical(projection).encode()).hexdigest()


def parse_model_identity(text: str) -> dict[str, Any]:
    """The model identity `model_identity` builds, as the ledger's object: a `kind` and
    its fields (`config.json`'s and the shard index's sha256, an HF id and revision...).

    Also reads schema 1's strings. A hash of a file that was missing reads as None; an
    identity this package did not build is `{"kind": "unknown", "text": ...}`.
    """
    kind, _, rest = text.partition(":")
    if text == "unspecified":
        return {"kind": "unspecified"}
    if kind == "standin" and rest.startswith("{"):
        try:
            fields = json.loads(rest)
        except ValueError:
            fields = None
        if isinstance(fields, dict):
            return {"kind": "standin", **fields}
    if kind == "endpoint" and ";served_name:" in rest:
        endpoint, _, served_name = rest.rpartition(";served_name:")
        return {"kind": "endpoint", "endpoint": endpoint, "served_name": served_name}
    if kind == "hf" and "@" in rest:
        hf_id, _, revision = rest.rpartition("@")
        return {"kind": "hf", "hf_id": hf_id, "revision": _known(revision, "unpinned")}
    path = _MODEL_PATH.match(text)
    if path is not None:
        fields = {"kind": "path", "path": path["path"], "config_sha256": _known(path["config"])}
        name, _, value = path["files"].partition(":")
        if name == "weights":
            fields["weights"] = [
                {"name": weight.rpartition("=")[0], "bytes": int(weight.rpartition("=")[2])}
                for weight in value.split(",")
                if weight.rpartition("=")[2].isdigit()
            ]
        else:
            fields["shard_index"] = name
            fields["shard_index_sha256"] = _known(value)
        return fields
    return {"kind": "unknown", "text": text}


def parse_backend_identity(text: str) -> dict[str, Any]:
    """The backend identity `backend_identity` builds, as the ledger's object: a `kind`
    (`cmd`, `image`, `standin`, `unspecified`) and its fields; also reads schema 1's
    strings. An identity this package did not build is `{"kind": "unknown", "text": ...}`."""
    kind, _, rest = text.partition(":")
    if text == "unspecified":
        return {"kind": "unspecified"}
    if kind == "cmd" and ";git:" in rest:
        command, _, tree = rest.rpartition(";git:")
        commit, dirty, diff = tree.partition("+dirty:")
        return {
            "kind": "cmd",
            "command": command,
            "git_commit": _known(commit, "none"),
            "git_dirty": bool(dirty),
            "git_diff_sha256": _known(diff, "untracked-only", ""),
        }
    if kind == "image" and rest:
        # A SIF named by its path is told apart by its header's hash.
        image, header, digest = rest.rpartition(";header:")
        if not header:
            return {"kind": "image", "image": rest, "header_sha256": None}
        return {"kind": "image", "image": image, "header_sha256": _known(digest)}
    if kind == "standin" and "@" in rest:
        module, _, version = rest.rpartition("@")
        return {"kind": "standin", "module": module, "version": version}
    return {"kind": "unknown", "text": text}


# `path:<dir>;config.json:<sha256>;<shard index>:<sha256>` or `...;weights:<name>=<bytes>,...`
_MODEL_PATH = re.compile(
    r"^path:(?P<path>.*?);config\.json:(?P<config>[0-9a-f]{64}|missing);(?P<files>[^;]*)$",
    re.DOTALL,
)


def _known(value: str, *unknown: str) -> str | None:
    """A hash or name, or None where the identity says it was missing or unknown."""
    return None if value in ("missing", *unknown) else value


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _header_sha256(path: Path, size: int = SIF_HEADER_BYTES) -> str:
    """sha256 of the file's first `size` bytes and its length, or "missing"."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(size)
            length = os.fstat(handle.fileno()).st_size
    except OSError:
        return "missing"
    return hashlib.sha256(head + b"\0" + str(length).encode()).hexdigest()


def _file_sha256(path: Path) -> str:
    try:
        with open(path, "rb") as handle:
            return hashlib.file_digest(handle, "sha256").hexdigest()
    except OSError:
        return "missing"
