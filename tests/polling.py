"""Polling for a condition in tests, and telling a live process from a dead one."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest


def wait_for(condition: Callable[[], bool], *, timeout: float, what: str) -> None:
    """Poll `condition` until it holds; `pytest.fail` naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


async def wait_for_async(condition: Callable[[], bool], *, timeout: float, what: str) -> None:
    """`wait_for` on an event loop: other tasks run while it polls."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.02)


def is_alive(pid: int) -> bool:
    """Whether `pid` names a running process (a zombie counts as dead)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purposes; its parent just has not reaped it yet.
    try:
        # The state follows the command name, which may itself hold ") ".
        return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return False
