"""Runners that are closed at teardown, and gates a test opens from the main thread."""

from __future__ import annotations

import asyncio
import threading
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from pytest_haico.runner.loop import Runner

AnyRunner = Runner[str, Any, Any]
MakeRunner = Callable[..., AnyRunner]
TIMEOUT = 5.0  # only reached when a test fails


def echo(key: str, outcome: object, in_flight_at_start: int) -> object:
    """A finish() that hands the coroutine's outcome to wait()."""
    return outcome


class Gates:
    """Per-key gates: a coroutine awaits its gate on the loop, the test opens it from outside."""

    def __init__(self) -> None:
        self.runner: AnyRunner | None = None
        self._gates: defaultdict[str, asyncio.Event] = defaultdict(asyncio.Event)
        self._started: defaultdict[str, threading.Event] = defaultdict(threading.Event)
        self._lock = threading.Lock()

    async def pass_(self, key: str) -> None:
        """Announce ``key`` started, then wait (on the loop) until the test opens its gate."""
        self.started(key).set()
        await self._gates[key].wait()

    def started(self, key: str) -> threading.Event:
        with self._lock:
            return self._started[key]

    def wait_started(self, *keys: str) -> None:
        for key in keys:
            assert self.started(key).wait(TIMEOUT), f"{key} never started"

    def open(self, *keys: str) -> None:
        assert self.runner is not None

        async def open_all() -> None:
            for key in keys:
                self._gates[key].set()

        self.runner.call(open_all, timeout=TIMEOUT)


@pytest.fixture
def make_runner() -> Iterator[MakeRunner]:
    """Build (and by default start) a `Runner`; every runner is closed at teardown."""
    made: list[AnyRunner] = []

    def make(*, concurrency: int = 4, start: bool = True, **kwargs: Any) -> AnyRunner:
        kwargs.setdefault("finish", echo)
        runner: AnyRunner = Runner(
            concurrency=concurrency, name=f"test-runner-{len(made)}", **kwargs
        )
        made.append(runner)
        if start:
            runner.start()
        return runner

    yield make
    for runner in made:
        runner.close()


@pytest.fixture
def gates() -> Gates:
    """Gates for conversations; set ``gates.runner`` before opening any."""
    return Gates()
