"""Polling for a condition in tests (a live process is told from a dead one by
`pytest_haico.procfs.is_alive`)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

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
