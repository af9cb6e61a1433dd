"""Real file systems for the ledger's failure tests (a tiny tmpfs: full, or read-only), and
the environment of tests/campaign (outside Slurm)."""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.campaign.conftest import _outside_slurm  # noqa: F401 - an autouse fixture

Mount = Callable[..., Path]


@pytest.fixture
def tmpfs() -> Iterator[Mount]:
    """`tmpfs(path, size="64k", read_only=False)` mounts a small tmpfs at `path` (root only);
    every mount is undone at teardown."""
    mounted: list[Path] = []

    def mount(path: Path, *, size: str = "64k", read_only: bool = False) -> Path:
        if os.geteuid() != 0:
            pytest.skip("mounting a tmpfs needs root")
        path.mkdir(parents=True, exist_ok=True)
        options = f"size={size},mode=0755" + (",ro" if read_only else "")
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
        mounted.append(path)
        return path

    yield mount
    for path in reversed(mounted):
        # Lazy: a file a failed run left open must not keep the mount.
        subprocess.run(["umount", "--lazy", str(path)], check=False)


def fill(directory: Path) -> Path:
    """Fill the file system of `directory` to the last byte; return the filler to remove."""
    filler = directory / "filler.bin"
    with open(filler, "wb", buffering=0) as handle:
        for _ in range(1 << 20):
            try:
                handle.write(b"\0" * 4096)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
                return filler
    raise AssertionError(f"{directory} did not fill up")
