"""The digest of a submission's frozen inputs: the experiments directory and cluster.env,
as `haico submit` copies them and as a job it submitted finds them (gate inputs_present)."""

from __future__ import annotations

import hashlib
import os
import re
import stat
from pathlib import Path

from pytest_haico.errors import ConfigError

# What `haico submit` exports to its jobs: the digest of the inputs it froze.
INPUTS_DIGEST_ENV = "HAICO_INPUTS_DIGEST"
DIGEST_PATTERN = re.compile(r"^sha256:[0-9a-f]{64}$")
# Written by running Python and pytest, never part of an experiment: a copy made with or
# without them digests the same.
SKIPPED_DIRS = frozenset({"__pycache__", ".pytest_cache"})
SKIPPED_SUFFIXES = (".pyc",)
_VERSION = b"haico-inputs-1\n"


def inputs_digest(experiments: Path, cluster_env: Path | None) -> str:
    """``sha256:<64 hex>`` over every regular file under `experiments` (by POSIX path
    relative to it, in sorted order; symlinks followed) and the bytes of `cluster_env`.

    Independent of mtimes, modes and where the directory is: a copy digests as its
    original. A dangling symlink, a special file, a directory loop or an unreadable
    file is a `ConfigError` naming it.
    """
    digest = hashlib.sha256(_VERSION)
    for relative, path in sorted(_iter_files(experiments)):
        _add(digest, b"f", relative.encode("utf-8", "surrogateescape"), _read(path))
    if cluster_env is None:
        digest.update(b"n")  # no cluster.env: unlike an empty one
    else:
        _add(digest, b"c", b"cluster.env", _read(cluster_env))
    return "sha256:" + digest.hexdigest()


def is_digest(value: str) -> bool:
    """Whether `value` has the form of an inputs digest (``sha256:`` + 64 lower-case hex)."""
    return DIGEST_PATTERN.match(value) is not None


def _add(digest: hashlib._Hash, tag: bytes, name: bytes, data: bytes) -> None:
    # A tag and two lengths make every (name, bytes) sequence encode differently.
    digest.update(tag + len(name).to_bytes(8, "big") + name + len(data).to_bytes(8, "big"))
    digest.update(data)


def _iter_files(root: Path) -> list[tuple[str, Path]]:
    """(POSIX path relative to `root`, path) of each file to digest, symlinks followed."""
    try:
        top = os.stat(root)
    except OSError as exc:
        raise ConfigError(str(root), "", f"cannot be read: {exc.strerror or exc}") from None
    if not stat.S_ISDIR(top.st_mode):
        raise ConfigError(str(root), "", "is not a directory")
    found: list[tuple[str, Path]] = []
    # (directory, its relative path, the (device, inode) of it and its ancestors)
    pending: list[tuple[Path, str, frozenset[tuple[int, int]]]] = [
        (root, "", frozenset({(top.st_dev, top.st_ino)}))
    ]
    while pending:
        directory, prefix, ancestors = pending.pop()
        try:
            entries = list(os.scandir(directory))
        except OSError as exc:
            raise ConfigError(
                str(directory), "", f"cannot be listed: {exc.strerror or exc}"
            ) from None
        for entry in entries:
            relative = prefix + entry.name
            path = Path(entry.path)
            try:
                info = entry.stat(follow_symlinks=True)
            except FileNotFoundError:
                raise ConfigError(
                    str(path), "", "is a dangling symlink: restore its target or remove it"
                ) from None
            except OSError as exc:
                raise ConfigError(str(path), "", f"cannot be read: {exc.strerror or exc}") from None
            if stat.S_ISDIR(info.st_mode):
                if entry.name in SKIPPED_DIRS:
                    continue
                key = (info.st_dev, info.st_ino)
                if key in ancestors:
                    raise ConfigError(
                        str(path), "", "is a symlink to a directory that contains it: remove it"
                    )
                pending.append((path, relative + "/", ancestors | {key}))
            elif stat.S_ISREG(info.st_mode):
                if not entry.name.endswith(SKIPPED_SUFFIXES):
                    found.append((relative, path))
            else:
                raise ConfigError(
                    str(path),
                    "",
                    "is neither a file nor a directory (a socket, FIFO or device): an "
                    "experiments directory holds files only; move it elsewhere",
                )
    return found


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ConfigError(str(path), "", f"cannot be read: {exc.strerror or exc}") from None
