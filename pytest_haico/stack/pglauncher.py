"""Postgres' programs run through a launcher (an image, for the cluster profile): the
launcher's interface, the image's binaries, and the server's user running its helpers."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from pytest_haico.errors import StackError
from pytest_haico.stack.pgbinaries import PostgresBinaries
from pytest_haico.stack.pgcluster import Helpers, Owner

_VERSION_TIMEOUT = 300.0  # the first start of an image from a shared file system is slow


class Launcher(Protocol):
    """How Postgres' programs run when they are not this host's: in an image.

    `wrap(argv, ...)` turns an argv for the image (programs named bare, found on the image's
    PATH) into one to exec here; the program gets exactly the variables of `env_file`
    (plus the image's own), and sees `binds` at the same paths as this host does.
    `environment()` is the environment of the wrapping process itself.
    """

    @property
    def image(self) -> Path: ...

    def wrap(
        self, argv: Sequence[str], *, env_file: Path | None, binds: Sequence[Path]
    ) -> list[str]: ...

    def environment(self) -> dict[str, str]: ...


@dataclass(frozen=True)
class ImageBinaries(PostgresBinaries):
    """Postgres in an image: `bin_dir` is the image, its programs are found on its PATH."""

    def tool(self, name: str) -> Path:
        """The program's bare name, for a launcher's `wrap`."""
        return Path(name)


@dataclass(frozen=True)
class LaunchedOwner(Owner):
    """The server's user, running its helpers (initdb, single-user postgres) through a
    launcher."""

    wrap: Callable[[list[str]], list[str]] = field(default=list, compare=False)

    def run(
        self,
        argv: list[str],
        log_path: Path,
        *,
        stdin: str | None = None,
        helpers: Helpers | None = None,
    ) -> None:
        super().run(self.wrap(argv), log_path, stdin=stdin, helpers=helpers)


def image_binaries(launcher: Launcher, *, name: str) -> ImageBinaries:
    """The image's Postgres: its version, from `postgres --version` run through the launcher."""
    argv = launcher.wrap(["postgres", "--version"], env_file=None, binds=())
    try:
        done = subprocess.run(
            argv,
            env=launcher.environment(),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=_VERSION_TIMEOUT,
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise StackError(f"{name}: could not run {argv[0]}: {exc}") from exc
    match = re.search(r"\(PostgreSQL\)\s+(\d+(?:\.\d+)?)", done.stdout)
    if done.returncode != 0 or match is None:
        said = (done.stderr or done.stdout).strip()[-500:]
        raise StackError(
            f"{name}: `postgres --version` in the image {launcher.image} failed "
            f"(status {done.returncode}): {said or '(no output)'}; is it a Postgres image?"
        )
    return ImageBinaries(launcher.image, match.group(1))
