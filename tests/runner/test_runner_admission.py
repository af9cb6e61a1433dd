"""Admission: the concurrency bound, submission order, in_flight_at_start, stopping."""

from __future__ import annotations

import asyncio
import threading
from functools import partial

import pytest

from pytest_haico.errors import NotAdmittedError
from pytest_haico.runner.loop import Runner
from tests.runner.conftest import TIMEOUT, Gates, MakeRunner


def test_concurrency_bound_is_reached_and_never_exceeded(make_runner: MakeRunner) -> None:
    running = 0
    most = 0

    async def converse() -> str:
        nonlocal running, most  # only the loop thread touches these
        running += 1
        most = max(most, running)
        await asyncio.sleep(0.01)
        running -= 1
        return "done"

    runner = make_runner(concurrency=16)
    keys = [f"k{i}" for i in range(200)]
    for key in keys:
        runner.submit(key, converse)
    assert [runner.wait(key, TIMEOUT) for key in keys] == ["done"] * 200
    assert most == 16
    assert runner.in_flight == 0


def test_keys_start_in_submission_order(make_runner: MakeRunner) -> None:
    started: list[str] = []

    async def converse(key: str, delay: float) -> None:
        started.append(key)
        await asyncio.sleep(delay)

    runner = make_runner(concurrency=3, start=False)
    keys = [f"k{i:02d}" for i in range(30)]
    # Uneven durations, so slots free up out of order.
    for i, key in enumerate(keys):
        runner.submit(key, partial(converse, key, (i * 7 % 5) / 1000))
    runner.start()
    for key in keys:
        runner.wait(key, TIMEOUT)
    assert started == keys


def test_in_flight_at_start_counts_the_conversations_already_running(
    make_runner: MakeRunner, gates: Gates
) -> None:
    runner = make_runner(concurrency=3, finish=lambda key, outcome, n: n)
    gates.runner = runner
    for key in ["a", "b", "c", "d", "e"]:
        runner.submit(key, partial(gates.pass_, key))
    gates.wait_started("a", "b", "c")
    assert runner.in_flight == 3
    assert not gates.started("d").is_set()
    gates.open("a")
    assert runner.wait("a", TIMEOUT) == 0
    gates.wait_started("d")
    gates.open("b")
    assert runner.wait("b", TIMEOUT) == 1
    gates.open("c", "d", "e")
    assert [runner.wait(key, TIMEOUT) for key in ["c", "d", "e"]] == [2, 2, 2]


def test_keys_submitted_before_start_run_after_start(make_runner: MakeRunner) -> None:
    async def converse() -> str:
        return "ran"

    runner = make_runner(start=False)
    runner.submit("early", converse)
    with pytest.raises(TimeoutError):
        runner.wait("early", timeout=0.01)
    runner.start()
    runner.submit("late", converse)
    assert runner.wait("early", TIMEOUT) == runner.wait("late", TIMEOUT) == "ran"


def test_a_key_is_submitted_once_and_must_be_known_to_wait(make_runner: MakeRunner) -> None:
    async def converse() -> None:
        return None

    runner = make_runner()
    runner.submit("k", converse)
    with pytest.raises(ValueError, match="'k' was already submitted"):
        runner.submit("k", converse)
    with pytest.raises(KeyError, match="'nope' was never submitted"):
        runner.wait("nope")


def test_stop_admitting_rejects_queued_keys_and_lets_in_flight_ones_finish(
    make_runner: MakeRunner, gates: Gates
) -> None:
    finished: list[str] = []

    def finish(key: str, outcome: object, n: int) -> object:
        finished.append(key)
        return outcome

    runner = make_runner(concurrency=2, finish=finish)
    gates.runner = runner
    for key in ["a", "b", "c", "d"]:
        runner.submit(key, partial(gates.pass_, key))
    gates.wait_started("a", "b")
    runner.stop_admitting("the walltime is nearly spent")
    runner.stop_admitting("a later reason")
    for key in ["c", "d"]:
        with pytest.raises(NotAdmittedError, match="the walltime is nearly spent"):
            runner.wait(key, TIMEOUT)
    runner.submit("e", lambda: gates.pass_("e"))
    with pytest.raises(NotAdmittedError) as raised:
        runner.wait("e", TIMEOUT)
    assert raised.value.reason == "the walltime is nearly spent"
    assert runner.stop_reason == "the walltime is nearly spent"
    gates.open("a", "b")
    assert runner.wait("a", TIMEOUT) is None
    assert runner.wait("b", TIMEOUT) is None
    assert sorted(finished) == ["a", "b"]


def test_the_admit_hook_is_asked_before_each_start_and_can_stop_admission(
    make_runner: MakeRunner,
) -> None:
    asked: list[str] = []

    def admit(key: str) -> str | None:
        asked.append(key)
        return "2 min left, p95 is 5 min" if key == "k2" else None

    async def converse() -> str:
        return "ran"

    runner = make_runner(concurrency=1, admit=admit, start=False)
    for i in range(5):
        runner.submit(f"k{i}", converse)
    runner.start()
    assert runner.wait("k0", TIMEOUT) == runner.wait("k1", TIMEOUT) == "ran"
    for key in ["k2", "k3", "k4"]:
        with pytest.raises(NotAdmittedError, match="2 min left, p95 is 5 min"):
            runner.wait(key, TIMEOUT)
    assert asked == ["k0", "k1", "k2"]


def test_a_failing_admit_hook_stops_admission_with_its_error(make_runner: MakeRunner) -> None:
    def admit(key: str) -> str | None:
        raise OSError("cannot read the job's end time")

    async def converse() -> None:
        return None

    runner = make_runner(admit=admit)
    runner.submit("k", converse)
    with pytest.raises(NotAdmittedError, match=r"admission check failed on 'k'.*job's end time"):
        runner.wait("k", TIMEOUT)


def test_finish_may_stop_admission_from_its_worker_thread(
    make_runner: MakeRunner, gates: Gates
) -> None:
    runner: Runner[str, None, str]

    def finish(key: str, outcome: object, n: int) -> str:
        if key == "k1":
            runner.stop_admitting("2 of the last 2 conversations failed on infrastructure")
        return "recorded"

    runner = make_runner(concurrency=1, finish=finish)
    gates.runner = runner
    keys = [f"k{i}" for i in range(6)]
    for key in keys:
        runner.submit(key, partial(gates.pass_, key))
    for key in keys[:2]:
        gates.open(key)
        assert runner.wait(key, TIMEOUT) == "recorded"
    # k2 may have been admitted in the moment between k1's end and its finish().
    if gates.started("k2").is_set():
        gates.open("k2")
        assert runner.wait("k2", TIMEOUT) == "recorded"
    for key in keys[3:]:
        with pytest.raises(NotAdmittedError, match="failed on infrastructure"):
            runner.wait(key, TIMEOUT)
        assert not gates.started(key).is_set()


def test_submit_is_thread_safe(make_runner: MakeRunner) -> None:
    async def converse() -> str:
        await asyncio.sleep(0)
        return "ran"

    runner = make_runner(concurrency=8)
    barrier = threading.Barrier(4)

    def submit_many(thread: int) -> None:
        barrier.wait(TIMEOUT)
        for i in range(50):
            runner.submit(f"t{thread}-{i}", converse)

    threads = [threading.Thread(target=submit_many, args=(t,)) for t in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(TIMEOUT)
    results = [runner.wait(f"t{t}-{i}", TIMEOUT) for t in range(4) for i in range(50)]
    assert results == ["ran"] * 200
