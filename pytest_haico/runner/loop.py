"""The event loop thread that keeps one arm's conversations in flight, in order, and drains them."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections import deque
from collections.abc import Awaitable, Callable, Hashable
from functools import partial
from types import TracebackType
from typing import Generic, TypeVar

from pytest_haico.errors import NotAdmittedError
from pytest_haico.runner.loop_thread import LoopThread

K = TypeVar("K", bound=Hashable)
R = TypeVar("R")
F = TypeVar("F")
T = TypeVar("T")

_log = logging.getLogger(__name__)
_LOOP_SLACK_S = 1.0


class _Escaped(Exception):
    """Carries a KeyboardInterrupt or SystemExit out of a task without ending the loop."""


class Runner(Generic[K, R, F]):
    """Runs coroutines in an event loop of its own thread, at most ``concurrency`` at once.

    Keys start in submission order. The moment a coroutine ends, ``finish(key,
    result or exception, in_flight_at_start)`` runs on a small thread pool, never
    on the loop (it writes to shared storage), and `wait` returns its value. A
    drained coroutine's finish gets the `asyncio.CancelledError`, or whatever
    the coroutine returned after catching it. ``admit(key)``, when given, runs on
    the loop before each start and returns a reason to stop admitting, or None.

    `stop_admitting` and `cancel_in_flight` are safe from any thread, from ``finish``
    and from ``admit``; `drain` and `close` block and must not be called from
    ``finish`` or the loop.
    """

    def __init__(
        self,
        *,
        concurrency: int,
        finish: Callable[[K, R | BaseException, int], F],
        admit: Callable[[K], str | None] | None = None,
        name: str = "haico-runner",
        finish_workers: int = 4,
        cancel_grace_s: float = 5.0,
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {concurrency}")
        self.concurrency = concurrency
        self.name = name
        self._finish_fn = finish
        self._admit_fn = admit
        self._cancel_grace_s = cancel_grace_s
        # Reentrant: a signal handler on the main thread may call stop_admitting
        # while that thread is inside submit. (A drain there would hold the lock
        # against the loop until its timeouts ran out: drain after the handler.)
        self._lock = threading.RLock()
        self._queue: deque[tuple[K, Callable[[], Awaitable[R]]]] = deque()
        self._futures: dict[K, concurrent.futures.Future[F]] = {}
        self._in_flight = 0
        self._admitted: set[K] = set()  # keys whose coroutine was started
        self._reason: str | None = None
        self._closed = False
        self._loop: LoopThread | None = None
        self._tasks: dict[asyncio.Task[R], K] = {}  # touched on the loop thread only
        self._in_finish = threading.local()
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=finish_workers, thread_name_prefix=f"{name}-finish"
        )

    # -- the calling threads ------------------------------------------------------------

    @property
    def in_flight(self) -> int:
        """How many coroutines are running now."""
        with self._lock:
            return self._in_flight

    @property
    def queued(self) -> int:
        """How many keys wait for a slot."""
        with self._lock:
            return len(self._queue)

    @property
    def stop_reason(self) -> str | None:
        """Why the runner stopped admitting (the first reason given), None while it admits."""
        with self._lock:
            return self._reason

    def was_admitted(self, key: K) -> bool:
        """Whether ``key``'s coroutine was started (it may have ended since)."""
        with self._lock:
            return key in self._admitted

    def resize(self, concurrency: int) -> None:
        """Admit up to `concurrency` at once from now on; those in flight above it go on."""
        with self._lock:
            self.concurrency = max(1, concurrency)
            loop = self._loop
        if loop is not None:
            loop.soon(self._pump)

    def start(self) -> None:
        """Start the loop thread; keys submitted before are admitted now."""
        with self._lock:
            if self._loop is not None or self._closed:
                raise RuntimeError(f"runner {self.name} was already started or closed")
            loop = LoopThread(self.name)
            self._loop = loop
            loop.loop.call_soon_threadsafe(self._pump)
        loop.start()

    def submit(self, key: K, factory: Callable[[], Awaitable[R]]) -> None:
        """Queue a conversation; ``factory()`` is called on the loop when it is admitted."""
        with self._lock:
            if key in self._futures:
                raise ValueError(f"{key!r} was already submitted to runner {self.name}")
            future: concurrent.futures.Future[F] = concurrent.futures.Future()
            self._futures[key] = future
            reason = self._reason
            if reason is None:
                self._queue.append((key, factory))
                if self._loop is not None:
                    self._loop.loop.call_soon_threadsafe(self._pump)
                return
        future.set_exception(NotAdmittedError(reason))

    def wait(self, key: K, timeout: float | None = None) -> F:
        """Block until ``key``'s finish() has returned, and return its value.

        Raises what finish() raised, `NotAdmittedError` for a key that was never
        started, `TimeoutError` after ``timeout`` seconds.
        """
        with self._lock:
            future = self._futures.get(key)
        if future is None:
            raise KeyError(f"{key!r} was never submitted to runner {self.name}")
        return future.result(timeout)

    def stop_admitting(self, reason: str) -> None:
        """Start nothing more: queued keys end as `NotAdmittedError`; the first reason is kept."""
        with self._lock:
            if self._reason is None:
                self._reason = reason
        self._reject_queued()

    def cancel_in_flight(self, reason: str) -> None:
        """Stop admitting and cancel every running coroutine now, without waiting for them.

        Safe from any thread, ``finish`` and ``admit`` included; each cancelled key's
        finish() runs as after a drain.
        """
        self.stop_admitting(reason)
        with self._lock:
            loop = self._loop
        if loop is not None:
            loop.soon(self._cancel_tasks)

    def cancel_after(self, delay: float, reason: str) -> None:
        """Stop admitting now; cancel what is still running `delay` seconds from now.

        Safe from a signal handler: it starts no thread and takes no lock the interrupted
        code could hold (the loop's own timer does the waiting).
        """
        self.stop_admitting(reason)
        with self._lock:
            loop = self._loop
        if loop is not None:
            loop.soon(loop.loop.call_later, delay, self._cancel_tasks)

    def drain(self, timeout: float, *, reason: str = "the run is draining") -> None:
        """Stop admitting, give in-flight coroutines ``timeout`` seconds, then cancel them.

        Returns once every started key's finish() has returned; a coroutine that
        does not end within ``cancel_grace_s`` of its cancellation, or a finish()
        that takes longer than that, is left behind with a logged warning.
        """
        self._refuse_blocking_call("drain")
        self.stop_admitting(reason)
        loop = self._loop
        # Not running: not started yet, so nothing was admitted, or already stopped.
        if loop is not None and loop.loop.is_running():
            drained = asyncio.run_coroutine_threadsafe(self._drain(timeout), loop.loop)
            try:
                # _drain bounds itself; this bound is for a loop blocked by a coroutine.
                drained.result(timeout + self._cancel_grace_s + _LOOP_SLACK_S)
            except TimeoutError:
                drained.cancel()
                _log.warning("runner %s: the event loop did not finish draining", self.name)
        with self._lock:
            unfinished = [future for future in self._futures.values() if not future.done()]
        _, late = concurrent.futures.wait(unfinished, self._cancel_grace_s)
        if late:
            _log.warning("runner %s: %d conversation(s) did not end on drain", self.name, len(late))

    def close(self) -> None:
        """Drain with no grace if needed, stop the loop and join its thread; idempotent."""
        self._refuse_blocking_call("close")
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self.drain(0, reason="the runner is closed")
        with self._lock:
            loop = self._loop
            unfinished = any(not future.done() for future in self._futures.values())
        if loop is not None:
            loop.stop(self._cancel_grace_s)
        # A finish() stuck on a hung mount must not hang close() (joined at interpreter exit).
        self._executor.shutdown(wait=not unfinished)

    def call(self, factory: Callable[[], Awaitable[T]], timeout: float | None = None) -> T:
        """Run one coroutine on the runner's loop (outside admission) and return its result.

        For what must live on this loop, such as the httpx client and its close.
        """
        loop = self._loop
        if loop is None or self._closed:
            raise RuntimeError(f"runner {self.name} is not running")
        return loop.call(factory, timeout)

    def cancel_calls(self) -> None:
        """Cancel every `call` under way: each raises `concurrent.futures.CancelledError` in
        its caller. Safe from a signal handler."""
        loop = self._loop
        if loop is not None:
            loop.cancel_calls()

    def __enter__(self) -> Runner[K, R, F]:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _on_loop_thread(self) -> bool:
        loop = self._loop
        return loop is not None and loop.is_current()

    def _refuse_blocking_call(self, what: str) -> None:
        if getattr(self._in_finish, "active", False) or self._on_loop_thread():
            raise RuntimeError(
                f"{what}() would wait on itself from the runner's loop or finish(); "
                "call stop_admitting() there"
            )

    def _reject_queued(self) -> None:
        with self._lock:
            reason = self._reason
            if reason is None or not self._queue:
                return
            rejected = [self._futures[key] for key, _ in self._queue]
            self._queue.clear()
        for future in rejected:
            future.set_exception(NotAdmittedError(reason))

    # -- the loop thread ----------------------------------------------------------------

    def _pump(self) -> None:
        """Start queued keys while there is room and admission is open."""
        while True:
            with self._lock:
                if self._reason is not None:
                    break
                if not self._queue or self._in_flight >= self.concurrency:
                    return
                key = self._queue[0][0]
            refusal = self._admission_refusal(key)
            if refusal is not None:
                self.stop_admitting(refusal)
                return
            with self._lock:
                # Only this thread pops, so the head is still ours unless the
                # queue was rejected meanwhile.
                if self._reason is not None:
                    break
                key, factory = self._queue.popleft()
                self._admitted.add(key)
                at_start = self._in_flight
                self._in_flight += 1
            task = asyncio.ensure_future(_converse(factory))
            self._tasks[task] = key
            task.add_done_callback(partial(self._on_done, key, at_start))
        # Keys queued by a submit that a signal handler interrupted mid-way.
        self._reject_queued()

    def _admission_refusal(self, key: K) -> str | None:
        if self._admit_fn is None:
            return None
        try:
            return self._admit_fn(key)
        except Exception as exc:
            # Fail closed: a broken admission check must not let the run overrun.
            return f"the admission check failed on {key!r}: {exc!r}"

    def _on_done(self, key: K, at_start: int, task: asyncio.Task[R]) -> None:
        del self._tasks[task]
        outcome: R | BaseException
        try:
            outcome = task.result()
        except _Escaped as exc:
            outcome = exc.__cause__ or exc
        except BaseException as exc:  # the conversation's own failure, or its cancellation
            outcome = exc
        with self._lock:
            self._in_flight -= 1
        # The slot is free now: the next conversation need not wait for storage.
        self._executor.submit(self._finish, key, outcome, at_start)
        self._pump()

    def _cancel_tasks(self) -> None:
        for task in list(self._tasks):
            task.cancel()

    async def _drain(self, timeout: float) -> None:
        if not self._tasks:
            return
        _, pending = await asyncio.wait(set(self._tasks), timeout=timeout)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending, timeout=self._cancel_grace_s)

    # -- the finish threads -------------------------------------------------------------

    def _finish(self, key: K, outcome: R | BaseException, at_start: int) -> None:
        with self._lock:
            future = self._futures[key]
        self._in_finish.active = True
        try:
            value = self._finish_fn(key, outcome, at_start)
        except BaseException as exc:
            future.set_exception(exc)
        else:
            future.set_result(value)
        finally:
            self._in_finish.active = False


async def _converse(factory: Callable[[], Awaitable[R]]) -> R:
    try:
        return await factory()
    except (KeyboardInterrupt, SystemExit) as exc:
        # A task re-raises these out of run_forever, which would end the loop thread.
        raise _Escaped(repr(exc)) from exc
