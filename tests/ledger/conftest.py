"""Real file systems for the ledger's failure tests (a tiny tmpfs: full, or read-only), and
the environment of tests/campaign (outside Slurm)."""

from __future__ import annotations

import errno
from pathlib import Path

from tests.campaign.conftest import _outside_slurm  # noqa: F401 - an autouse fixture
from tests.conftest import Mount

__all__ = ["Mount", "fill"]


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
