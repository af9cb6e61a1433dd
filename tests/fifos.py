"""FIFOs where a file belongs, and a call that must not wait on one."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

T = TypeVar("T")
# A correct caller returns in milliseconds; this only bounds how long a hang is waited for.
HANG_S = 60.0


def plant_fifo(path: Path) -> Path:
    """A FIFO at `path`, in place of whatever was there."""
    path.unlink(missing_ok=True)
    os.mkfifo(path)
    return path


def without_waiting(call: Callable[[], T], fifo: Path) -> T:
    """`call()`'s value; the test fails if it is still waiting after HANG_S. Then the FIFO
    gets a reader and a writer that close at once, which ends the call's wait either way."""
    done: list[T] = []
    failed: list[BaseException] = []

    def run() -> None:
        try:
            done.append(call())
        except BaseException as exc:  # re-raised in the test's thread
            failed.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(HANG_S)
    if thread.is_alive():
        for flags in (os.O_RDONLY, os.O_WRONLY):
            with contextlib.suppress(OSError):
                os.close(os.open(fifo, flags | os.O_NONBLOCK))
        thread.join(HANG_S)
        pytest.fail(f"still waiting on the FIFO {fifo} after {HANG_S:.0f} s")
    if failed:
        raise failed[0]
    return done[0]
