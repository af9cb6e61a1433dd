"""Draining: in-flight conversations get their time, stragglers are cancelled; close()."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from functools import partial

import pytest

from pytest_haico.errors import NotAdmittedError
from pytest_haico.runner.loop import Runner
from tests.polling import wait_for, wait_for_return
from tests.runner.conftest import TIMEOUT, Gates, MakeRunner, echo


def test_drain_waits_for_in_flight_conversations_and_their_records(
    make_runner: MakeRunner, gates: Gates
) -> None:
    async def converse() -> str:
        await gates.pass_("a")
        await asyncio.sleep(0.02)
        return "answer"

    runner = make_runner(concurrency=1)
    gates.runner = runner
    runner.submit("a", converse)
    runner.submit("queued", converse)
    gates.wait_started("a")
    # An hour's drain: it returns when "a" has ended, never at its timeout. "a" may end only
    # once the drain stopped admission, or "queued" would take its slot first.
    failures: list[BaseException] = []

    def drain() -> None:
        try:
            runner.drain(3600, reason="USR1: the walltime is near")
        except BaseException as exc:  # handed to the test's thread
            failures.append(exc)

    draining = threading.Thread(target=drain, daemon=True)
    draining.start()
    wait_for(lambda: runner.stop_reason is not None, timeout=60, what="the drain to begin")
    gates.open("a")
    draining.join(60)
    assert not draining.is_alive(), "the drain did not return once the conversation ended"
    assert failures == []
    # Both are settled the moment drain returns: no waiting.
    assert runner.wait("a", timeout=0) == "answer"
    with pytest.raises(NotAdmittedError, match="USR1"):
        runner.wait("queued", timeout=0)
    assert runner.in_flight == 0


def test_drain_cancels_stragglers_after_the_timeout(make_runner: MakeRunner, gates: Gates) -> None:
    async def hangs() -> str:
        await gates.pass_("hangs")
        return "never"

    async def interrupted() -> str:
        try:
            await gates.pass_("interrupted")
        except asyncio.CancelledError:
            # What the driver's caller does: ConversationProgress.interrupted_result().
            return "interrupted during turn 1"
        return "never"

    runner = make_runner(concurrency=2)
    runner.submit("hangs", hangs)
    runner.submit("interrupted", interrupted)
    gates.wait_started("hangs", "interrupted")
    started = time.monotonic()
    wait_for_return(lambda: runner.drain(0.05), timeout=60, what="the drain to cancel both")
    assert time.monotonic() - started >= 0.05  # they were given the drain's time first
    assert isinstance(runner.wait("hangs", timeout=0), asyncio.CancelledError)
    assert runner.wait("interrupted", timeout=0) == "interrupted during turn 1"


def test_drain_gives_up_on_a_conversation_that_ignores_cancellation(
    make_runner: MakeRunner, caplog: pytest.LogCaptureFixture
) -> None:
    started = threading.Event()

    async def stubborn() -> None:
        started.set()
        while True:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(3600)

    runner = make_runner(cancel_grace_s=0.05)
    runner.submit("stubborn", stubborn)
    assert started.wait(TIMEOUT)
    wait_for_return(lambda: runner.drain(0), timeout=60, what="the drain to give up on it")
    assert "did not end on drain" in caplog.text
    with pytest.raises(TimeoutError):
        runner.wait("stubborn", timeout=0)


def test_close_cancels_what_is_in_flight_and_joins_the_loop_thread(gates: Gates) -> None:
    runner: Runner[str, None, object] = Runner(concurrency=2, finish=echo, name="test-close")
    runner.start()
    runner.submit("hangs", lambda: gates.pass_("hangs"))
    gates.wait_started("hangs")
    runner.close()
    assert isinstance(runner.wait("hangs", timeout=0), asyncio.CancelledError)
    assert not [thread for thread in threading.enumerate() if thread.name == "test-close"]
    runner.close()  # idempotent
    runner.submit("late", lambda: gates.pass_("late"))
    with pytest.raises(NotAdmittedError, match="the runner is closed"):
        runner.wait("late", timeout=0)
    with pytest.raises(RuntimeError, match="already started or closed"):
        runner.start()


def test_close_without_start_rejects_what_was_queued() -> None:
    async def converse() -> None:
        return None

    runner: Runner[str, None, object] = Runner(concurrency=1, finish=echo)
    runner.submit("k", converse)
    runner.close()
    with pytest.raises(NotAdmittedError, match="the runner is closed"):
        runner.wait("k", timeout=0)


def test_drain_and_close_refuse_to_run_inside_finish(make_runner: MakeRunner) -> None:
    runner: Runner[str, None, str]

    def finish(key: str, outcome: object, n: int) -> str:
        for blocking in (runner.drain, lambda _: runner.close()):
            try:
                blocking(0)
            except RuntimeError as exc:
                assert "call stop_admitting() there" in str(exc)
            else:
                raise AssertionError("a blocking call inside finish() was allowed")
        return "recorded"

    async def converse() -> None:
        return None

    runner = make_runner(finish=finish)
    runner.submit("k", converse)
    assert runner.wait("k", TIMEOUT) == "recorded"


def test_cancel_in_flight_cancels_at_once_without_waiting_and_admits_nothing_more(
    make_runner: MakeRunner, gates: Gates
) -> None:
    async def converse(key: str) -> str:
        try:
            await gates.pass_(key)
        except asyncio.CancelledError:
            return f"{key} cancelled"
        return "never"

    runner = make_runner(concurrency=2)
    for key in ("a", "b", "queued"):
        runner.submit(key, partial(converse, key))
    gates.wait_started("a", "b")
    # From another thread, as the watch that found a dead service does; it does not block.
    watcher = threading.Thread(target=runner.cancel_in_flight, args=("postgres died",))
    watcher.start()
    watcher.join(TIMEOUT)
    assert not watcher.is_alive()
    assert runner.wait("a", TIMEOUT) == "a cancelled"
    assert runner.wait("b", TIMEOUT) == "b cancelled"
    with pytest.raises(NotAdmittedError, match="postgres died"):
        runner.wait("queued", timeout=0)
    assert runner.stop_reason == "postgres died"


def test_cancel_after_stops_admitting_now_and_cancels_stragglers_later_without_a_thread(
    make_runner: MakeRunner, gates: Gates
) -> None:
    async def interrupted() -> str:
        try:
            await gates.pass_("a")
        except asyncio.CancelledError:
            return "interrupted"
        return "answer"

    runner = make_runner(concurrency=1)
    runner.submit("a", interrupted)
    runner.submit("queued", interrupted)
    gates.wait_started("a")
    threads = threading.active_count()
    runner.cancel_after(0.05, "SIGUSR1: draining")
    assert threading.active_count() == threads  # safe from a signal handler: no new thread
    with pytest.raises(NotAdmittedError, match="SIGUSR1"):
        runner.wait("queued", timeout=0)
    assert runner.wait("a", timeout=TIMEOUT) == "interrupted"
