"""The catalogue of served models: `<catalogue>/<name>.json` entries and their key files.

An entry says where a served model answers and what it is (schema 1, one JSON object):
`name`, `host`, `port`, `served_name`, `identity` (`model` as `config.identity` builds it,
`vllm`: the `[vllm]` settings the server runs with, `vllm_version`), `model` (the model
identity's fields for a reader: config.json's and the shard index's sha256, or HF id and
revision; derived, never read back), `job` (`id`, `node`, `restart_count`, `end_time` in
UTC or null), `owner` (`uid`, `name`), `arm`, `registered_at` and `key_file`. The API key
is never in the entry: it is in `key_file`, `<name>.<job id>.key` beside it (`<name>.<job
id>.r<restart>.key` once Slurm requeued the job), 0600, or 0640 with a Unix group when
serving shares it (one key file per job and run of it, so a successor's new key never meets
its predecessor's entry, nor a requeued job's its earlier run's, which may still be alive on
a node that stopped answering).

Trust. The catalogue is data another user could write, so a reader trusts it only as far
as its directory's owner: the directory must be a real directory of the reading user that
nobody else may write; an entry must be a regular file of that same owner, not writable by
group or others, whose `owner.uid` says so; the key file likewise. Everything else is a
`CatalogueError` of one line. Whether the entry's job still runs is the resolver's question
(`serve.resolver`), never the entry's word.
"""

from __future__ import annotations

import contextlib
import grp
import json
import os
import socket
import stat
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pytest_haico.config.bounds import ARM_NAME
from pytest_haico.config.identity import parse_model_identity
from pytest_haico.errors import CatalogueError, UntrustedFileError
from pytest_haico.files import (
    PRIVATE_FILE_MODE,
    make_dirs,
    ownership_problem,
    read_owned_file,
    write_atomic,
)
from pytest_haico.stamps import utc_iso

SCHEMA = 1
SHARED_KEY_MODE = 0o640  # a key shared with a Unix group: its members may read it
_ENTRY_SUFFIX = ".json"
_MAX_ENTRY_BYTES = 64 * 1024
_GITIGNORE = b"# Written by haico serve: served models' API keys are never committed.\n*\n"


class _Part(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class ServedIdentity(_Part):
    """What answers: the weights' identity (`config.identity.model_identity`), how vLLM
    serves them (the arm's `[vllm]` settings), and vLLM's version."""

    model: str
    vllm: dict[str, Any]
    vllm_version: str | None = None


class EntryJob(_Part):
    """The Slurm job that serves: its id, its node, how often it was requeued, when it ends
    (UTC)."""

    id: str = Field(pattern=r"^[0-9]+(_[0-9]+)?$")
    node: str = Field(min_length=1)
    restart_count: int = Field(ge=0)
    end_time: str | None = None


class EntryOwner(_Part):
    uid: int = Field(ge=0)
    name: str


class CatalogueEntry(_Part):
    """One served model, as `<catalogue>/<name>.json` holds it."""

    name: str = Field(pattern=ARM_NAME.pattern, max_length=128)
    host: str = Field(min_length=1, max_length=255)
    port: int = Field(ge=1, le=65535)
    served_name: str = Field(min_length=1)
    identity: ServedIdentity
    job: EntryJob
    owner: EntryOwner
    arm: str
    registered_at: str
    key_file: str = Field(pattern=r"^[a-z0-9_.-]+\.key$")

    @property
    def endpoint(self) -> str:
        """The OpenAI-compatible base URL clients use."""
        return f"http://{self.host}:{self.port}/v1"

    def to_json(self) -> bytes:
        """The entry's file content; the parsed model identity rides along for readers."""
        document = {"schema": SCHEMA, **self.model_dump(mode="json")}
        document["model"] = parse_model_identity(self.identity.model)
        return (json.dumps(document, indent=2, sort_keys=True) + "\n").encode()

    @classmethod
    def from_json(cls, data: bytes, *, where: Path) -> CatalogueEntry:
        """The entry in `data`; a `CatalogueError` naming `where` when it is not one."""
        try:
            document = json.loads(data)
            if not isinstance(document, dict):
                raise ValueError("not a JSON object")
            if document.pop("schema", None) != SCHEMA:
                raise ValueError(f"not of schema {SCHEMA}")
            document.pop("model", None)  # derived from identity.model: never read back
            return cls.model_validate(document)
        except (ValueError, ValidationError) as exc:
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise CatalogueError(f"{where} is not a catalogue entry ({first})") from None


def entry_path(catalogue: Path, name: str) -> Path:
    return catalogue / f"{name}{_ENTRY_SUFFIX}"


def key_file_name(name: str, job_id: str, restart_count: int = 0) -> str:
    """The key file of `name` served by job `job_id` in its run `restart_count`."""
    if restart_count:
        return f"{name}.{job_id}.r{restart_count}.key"
    return f"{name}.{job_id}.key"


def now_utc() -> str:
    return utc_iso()


def check_catalogue_dir(catalogue: Path) -> os.stat_result:
    """The catalogue directory's status, if it is a directory of this user that nobody else
    may write; a `CatalogueError` saying what is wrong otherwise (or that it is missing)."""
    try:
        info = os.lstat(catalogue)
    except FileNotFoundError:
        if not catalogue.parent.is_dir():  # not nothing served: a place this host cannot see
            raise CatalogueError(
                f"{catalogue}: no catalogue here: {catalogue.parent} does not exist on "
                f"{socket.gethostname()}: a served model is found only through a catalogue on "
                "a file system shared with the node that serves it (set CLUSTER_WORK, or "
                "--haico-catalogue DIR, to a shared directory)"
            ) from None
        raise CatalogueError(
            f"{catalogue}: no catalogue here: no model is served (`haico serve <arm>` serves one)"
        ) from None
    problem = ownership_problem(info)
    if problem is None and not stat.S_ISDIR(info.st_mode):
        problem = "is not a directory"
    if problem is not None:
        raise CatalogueError(
            f"the catalogue {catalogue} {problem}: it is not yours alone, so its entries "
            "cannot be trusted; use a catalogue directory of your own (CLUSTER_WORK)"
        )
    return info


def make_catalogue_dir(catalogue: Path, *, file_mode: int) -> None:
    """Create the catalogue (with the results' directory mode) if missing, then check it.

    Without $CLUSTER_WORK the catalogue is `<rootdir>/catalogue`, inside the experiments'
    repository, and its key files beside the entries: a `.gitignore` of `*` keeps git from
    ever adding them (as pytest's cache does), whatever the repository's own ignores."""
    make_dirs(catalogue, file_mode)
    check_catalogue_dir(catalogue)
    ignore = catalogue / ".gitignore"
    if not ignore.exists():
        write_atomic(ignore, _GITIGNORE, mode=file_mode)


def read_entry(catalogue: Path, name: str) -> CatalogueEntry:
    """The entry of `name`, read with every trust check (module docstring); a
    `CatalogueError` naming the served models there when there is none."""
    owner = check_catalogue_dir(catalogue).st_uid
    path = entry_path(catalogue, name)
    try:
        data = read_owned_file(path, uid=owner)
    except FileNotFoundError:
        known = ", ".join(entry_names(catalogue)) or "none"
        raise CatalogueError(
            f"no served model named {name!r} in {catalogue} (served there: {known}); "
            f"start it with `haico serve <arm> --name {name}`"
        ) from None
    except UntrustedFileError as exc:
        raise CatalogueError(f"refused catalogue entry: {exc}") from None
    if len(data) > _MAX_ENTRY_BYTES:
        raise CatalogueError(f"refused catalogue entry: {path} is larger than an entry can be")
    entry = CatalogueEntry.from_json(data, where=path)
    if entry.name != name or entry.owner.uid != owner:
        raise CatalogueError(
            f"refused catalogue entry: {path} claims to be {entry.name!r} of uid "
            f"{entry.owner.uid}, but is {name!r} in the catalogue of uid {owner}"
        )
    return entry


def entry_names(catalogue: Path) -> list[str]:
    """The names that have an entry file (trusted or not: `read_entry` decides)."""
    with contextlib.suppress(OSError):
        return sorted(
            path.name.removesuffix(_ENTRY_SUFFIX)
            for path in catalogue.iterdir()
            if path.name.endswith(_ENTRY_SUFFIX) and not path.name.startswith(".")
        )
    return []


def read_key(catalogue: Path, entry: CatalogueEntry) -> str:
    """The entry's API key, from its key file (the catalogue owner's, 0600 or 0640)."""
    path = catalogue / entry.key_file
    if path.exists() and not os.access(path, os.R_OK):
        raise CatalogueError(
            f"{path}: cannot read the key of served model {entry.name!r}: it is not shared "
            "with you (SERVE_KEY_GROUP in the serving user's cluster.env)"
        )
    try:
        data = read_owned_file(path, uid=entry.owner.uid)
    except FileNotFoundError:
        raise CatalogueError(
            f"{path}: the key file of served model {entry.name!r} is missing (its job may "
            "be ending)"
        ) from None
    except UntrustedFileError as exc:
        raise CatalogueError(f"refused key file: {exc}") from None
    mode = stat.S_IMODE(os.lstat(path).st_mode)
    if mode & stat.S_IROTH:
        raise CatalogueError(
            f"refused key file: {path} is readable by others (mode {mode:04o}): the key has "
            "leaked; stop the served model (`haico serve stop`) and serve it again"
        )
    key = data.decode("utf-8", "replace").strip()
    if not key:
        raise CatalogueError(f"{path}: the key file of served model {entry.name!r} is empty")
    return key


def register(
    catalogue: Path, entry: CatalogueEntry, api_key: str, *, file_mode: int, key_group: str | None
) -> Path:
    """Write the key file, then the entry (atomically, in `file_mode`): a reader who finds
    the entry finds its key. A `key_group` makes the key 0640 with that group."""
    make_catalogue_dir(catalogue, file_mode=file_mode)
    key_path = catalogue / entry.key_file
    key_mode = PRIVATE_FILE_MODE if key_group is None else SHARED_KEY_MODE
    write_atomic(key_path, api_key.encode() + b"\n", mode=key_mode)
    if key_group is not None:
        os.chown(key_path, -1, _group_id(key_group))
    path = entry_path(catalogue, entry.name)
    write_atomic(path, entry.to_json(), mode=file_mode)
    return path


def deregister(catalogue: Path, name: str, *, job_id: str, restart_count: int = 0) -> bool:
    """Remove `name`'s entry if it is run `restart_count` of job `job_id` (never another
    job's, a successor's, nor a later run's of the same job, requeued onto another node),
    and that run's key file in any case. True when an entry was removed."""
    removed = False
    path = entry_path(catalogue, name)
    try:
        entry = CatalogueEntry.from_json(read_owned_file(path), where=path)
    except (FileNotFoundError, UntrustedFileError, CatalogueError):
        entry = None
    if entry is not None and (entry.job.id, entry.job.restart_count) == (job_id, restart_count):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            removed = True
    with contextlib.suppress(FileNotFoundError):
        (catalogue / key_file_name(name, job_id, restart_count)).unlink()
    return removed


def _group_id(name: str) -> int:
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        raise CatalogueError(
            f"SERVE_KEY_GROUP={name}: no such Unix group to share the key with"
        ) from None
