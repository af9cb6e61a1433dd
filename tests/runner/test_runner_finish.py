"""finish(): off the loop, before wait() returns, while the main thread is busy; failures."""

from __future__ import annotations

import asyncio
import threading

import pytest

from tests.runner.conftest import TIMEOUT, MakeRunner


def test_finish_runs_off_the_loop_and_before_wait_returns(make_runner: MakeRunner) -> None:
    loop_thread: list[int] = []
    finish_thread: list[int] = []
    release = threading.Event()

    async def converse() -> str:
        loop_thread.append(threading.get_ident())
        return "answer"

    def finish(key: str, outcome: object, n: int) -> str:
        finish_thread.append(threading.get_ident())
        assert release.wait(TIMEOUT)  # slow shared storage
        return f"recorded {outcome}"

    runner = make_runner(finish=finish)
    runner.submit("k", converse)
    with pytest.raises(TimeoutError):
        runner.wait("k", timeout=0.02)
    release.set()
    assert runner.wait("k", TIMEOUT) == "recorded answer"
    assert finish_thread[0] not in (loop_thread[0], threading.get_ident())
    assert loop_thread[0] != threading.get_ident()


def test_a_slow_finish_does_not_hold_the_loop(make_runner: MakeRunner) -> None:
    release = threading.Event()

    def finish(key: str, outcome: object, n: int) -> object:
        if key == "slow":
            assert release.wait(TIMEOUT)
        return outcome

    async def converse() -> str:
        return "quick"

    runner = make_runner(concurrency=1, finish=finish)
    runner.submit("slow", converse)
    runner.submit("next", converse)
    # "next" starts and ends while "slow"'s record is still being written.
    assert runner.wait("next", TIMEOUT) == "quick"
    release.set()
    assert runner.wait("slow", TIMEOUT) == "quick"


def test_conversations_progress_while_the_main_thread_is_blocked(
    make_runner: MakeRunner,
) -> None:
    recorded: list[str] = []
    all_recorded = threading.Event()

    def finish(key: str, outcome: object, n: int) -> None:
        recorded.append(key)
        if len(recorded) == 20:
            all_recorded.set()

    async def converse() -> None:
        for _ in range(3):
            await asyncio.sleep(0.002)

    runner = make_runner(concurrency=4, finish=finish, finish_workers=1)
    for i in range(20):
        runner.submit(f"k{i}", converse)
    # The main thread blocks on something else entirely (collection, a report).
    assert all_recorded.wait(TIMEOUT)
    assert sorted(recorded) == sorted(f"k{i}" for i in range(20))


def test_an_exception_in_a_conversation_reaches_finish_and_spares_the_loop(
    make_runner: MakeRunner,
) -> None:
    async def broken() -> str:
        raise ValueError("the backend sent garbage")

    async def exits() -> str:
        raise SystemExit(3)

    async def fine() -> str:
        return "answer"

    runner = make_runner(finish=lambda key, outcome, n: (type(outcome).__name__, str(outcome)))
    runner.submit("broken", broken)
    runner.submit("exits", exits)
    runner.submit("not-awaitable", lambda: None)  # type: ignore[arg-type, return-value]
    assert runner.wait("broken", TIMEOUT) == ("ValueError", "the backend sent garbage")
    assert runner.wait("exits", TIMEOUT) == ("SystemExit", "3")
    assert runner.wait("not-awaitable", TIMEOUT)[0] == "TypeError"
    runner.submit("after", fine)
    assert runner.wait("after", TIMEOUT) == ("str", "answer")


def test_an_exception_in_finish_is_raised_by_wait(make_runner: MakeRunner) -> None:
    def finish(key: str, outcome: object, n: int) -> None:
        raise OSError(f"no space left writing the record of {key}")

    async def fine() -> str:
        return "answer"

    runner = make_runner(finish=finish)
    runner.submit("k", fine)
    with pytest.raises(OSError, match="no space left writing the record of k"):
        runner.wait("k", TIMEOUT)
    runner.submit("after", fine)
    with pytest.raises(OSError, match="record of after"):
        runner.wait("after", TIMEOUT)


def test_call_runs_a_coroutine_on_the_loop(make_runner: MakeRunner) -> None:
    async def loop_thread() -> int:
        asyncio.get_running_loop()
        return threading.get_ident()

    async def converse() -> int:
        return threading.get_ident()

    runner = make_runner()
    runner.submit("k", converse)
    assert runner.call(loop_thread, TIMEOUT) == runner.wait("k", TIMEOUT)
