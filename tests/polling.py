"""Polling for a condition in tests, and waiting for a call to return (a live process is
told from a dead one by `pytest_haico.procfs.is_alive`)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import TypeVar

import pytest

T = TypeVar("T")


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


def wait_for_return(call: Callable[[], T], *, timeout: float, what: str) -> T:
    """`call()` in a thread of its own: its result (or its exception) once it returns;
    `pytest.fail` naming `what` if it still runs after `timeout` seconds. For a call whose
    wrong behaviour is to wait for something far longer than `timeout`, or forever."""
    outcome: list[T] = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            outcome.append(call())
        except BaseException as exc:  # handed to the test's thread
            failure.append(exc)

    thread = threading.Thread(target=run, name=f"wait-for-return: {what}", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        pytest.fail(f"still waiting after {timeout} s for {what}")
    if failure:
        raise failure[0]
    return outcome[0]
