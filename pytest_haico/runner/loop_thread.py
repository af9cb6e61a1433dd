"""An asyncio event loop in a daemon thread of its own, reached from other threads."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")

_log = logging.getLogger(__name__)


class LoopThread:
    """`loop` runs in thread `name` from `start` until `stop`; everything else here is safe
    from any other thread."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.loop = asyncio.new_event_loop()
        # A daemon, so a hung loop cannot hold the interpreter at exit; stop() joins it.
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._calls: set[concurrent.futures.Future[Any]] = set()  # call()s under way

    def start(self) -> None:
        self._thread.start()

    def soon(self, callback: Callable[..., object], *args: Any) -> None:
        """`callback(*args)` on the loop; nothing once the loop was closed."""
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(callback, *args)

    def is_current(self) -> bool:
        """Whether the caller runs on the loop's thread."""
        return self._thread.ident == threading.get_ident()

    def call(self, factory: Callable[[], Awaitable[T]], timeout: float | None = None) -> T:
        """Run `factory()` on the loop and return its result; `cancel_calls` ends it."""
        if self.is_current():
            raise RuntimeError("call() from the runner's own loop would wait on itself")
        future = asyncio.run_coroutine_threadsafe(_awaited(factory), self.loop)
        self._calls.add(future)
        try:
            return future.result(timeout)
        except TimeoutError:
            future.cancel()
            raise
        finally:
            self._calls.discard(future)

    def cancel_calls(self) -> None:
        """Cancel every `call` under way: each raises `concurrent.futures.CancelledError` in
        its caller. Safe from a signal handler (a future's cancel takes only its own
        reentrant lock, and hands the task's cancellation to the loop)."""
        for future in list(self._calls):
            future.cancel()

    def stop(self, timeout: float) -> None:
        """Stop the loop and join its thread for up to `timeout` seconds."""
        self.soon(self.loop.stop)
        self._thread.join(timeout)
        if self._thread.is_alive():
            _log.warning("runner %s: the event loop thread did not stop", self.name)

    def _serve(self) -> None:
        loop = self.loop
        asyncio.set_event_loop(loop)
        try:
            loop.run_forever()
        finally:
            try:
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.run_until_complete(loop.shutdown_default_executor())
            finally:
                loop.close()


async def _awaited(factory: Callable[[], Awaitable[T]]) -> T:
    return await factory()
