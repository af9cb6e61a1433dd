"""Concurrency auto's policy on synthetic /metrics samples (no services), and the runner's
resize."""

from __future__ import annotations

import asyncio
import threading

from pytest_haico.ledger.model_metrics import Sample
from pytest_haico.runner.adaptive import KV_FULL, AdaptiveConcurrency, summary_line
from pytest_haico.runner.loop import Runner


def _s(
    *,
    running: float | None,
    in_flight: int,
    queued: int = 10,
    waiting: float | None = 0.0,
    kv: float | None = 0.1,
) -> Sample:
    return Sample(0.0, running, waiting, kv, 0.0, 0.0, in_flight, queued, None, 0.0)


def _controller(initial: int = 1, maximum: int = 16) -> AdaptiveConcurrency:
    return AdaptiveConcurrency(initial=initial, maximum=maximum, clock=lambda: 100.0)


def test_a_model_with_room_and_items_queued_doubles_then_stops_at_the_maximum() -> None:
    auto = _controller(maximum=6)
    targets = []
    for _ in range(5):
        # Every conversation at the model, none waiting: a batch with room.
        auto.observe(_s(running=auto.target, in_flight=auto.target))
        targets.append(auto.target)
    assert targets == [2, 4, 6, 6, 6]
    first = auto.adaptations[0]
    assert (first.at, first.old, first.new) == (100.0, 1, 2)
    assert first.reason == "model has room (1 running, none waiting), items queued"


def test_after_the_first_overload_it_grows_by_one() -> None:
    auto = _controller(initial=8)
    auto.observe(_s(running=4, in_flight=8, waiting=2))
    assert auto.target == 7
    auto.observe(_s(running=4, in_flight=7))
    auto.observe(_s(running=4, in_flight=8))
    assert auto.target == 9


def test_waiting_requests_lower_it_by_one_once_until_in_flight_came_down() -> None:
    auto = _controller(initial=16)
    change = auto.observe(_s(running=4, in_flight=16, waiting=3))
    assert change is not None and (change.old, change.new) == (16, 15)
    assert change.reason == "3 requests waiting"
    # Still waiting, but the 16 admitted before are still in flight: no second drop yet.
    assert auto.observe(_s(running=4, in_flight=16, waiting=1)) is None
    assert auto.target == 15
    # Down to the target and still waiting: one more down.
    auto.observe(_s(running=4, in_flight=15, waiting=1))
    assert auto.target == 14


def test_a_near_full_kv_cache_admits_no_more() -> None:
    auto = _controller(initial=4)
    change = auto.observe(_s(running=1, in_flight=4, kv=KV_FULL))
    assert change is not None and change.new == 2 and change.reason == "KV cache 90% used"


def test_it_never_goes_below_one() -> None:
    auto = _controller(initial=1)
    assert auto.observe(_s(running=1, in_flight=1, waiting=5)) is None
    assert auto.target == 1


def test_a_drop_counts_from_what_is_in_flight() -> None:
    auto = _controller(initial=16)
    auto.observe(_s(running=4, in_flight=4, queued=0, waiting=2))
    assert auto.target == 3
    auto = _controller(initial=16)
    auto.observe(_s(running=4, in_flight=4, queued=0, kv=0.95))
    assert auto.target == 2


def test_it_holds_without_a_queue_or_without_the_models_figures() -> None:
    auto = _controller(initial=4)
    assert auto.observe(_s(running=0, in_flight=4, queued=0)) is None  # nothing to admit
    assert auto.observe(_s(running=0, in_flight=2)) is None  # free slots already
    assert auto.observe(_s(running=None, in_flight=4, waiting=None, kv=None)) is None
    assert auto.target == 4 and auto.adaptations == []


def test_the_record_and_its_summary_line() -> None:
    auto = _controller(maximum=16)
    for _ in range(3):
        auto.observe(_s(running=0, in_flight=auto.target))
    auto.observe(_s(running=4, in_flight=8, kv=0.92))
    record = auto.record()
    assert (record["mode"], record["bounds"], record["initial"], record["final"]) == (
        "auto",
        [1, 16],
        1,
        4,
    )
    assert [(a["old"], a["new"]) for a in record["adaptations"]] == [(1, 2), (2, 4), (4, 8), (8, 4)]
    assert summary_line(record) == "concurrency auto: 1→4 (bounds 1 to 16), 4 adaptations"


def test_the_runner_admits_more_when_resized_up_and_no_more_when_down() -> None:
    release = threading.Event()
    started: list[int] = []
    all_started = threading.Semaphore(0)

    async def converse(key: int) -> int:
        started.append(key)
        all_started.release()
        while not release.is_set():
            await asyncio.sleep(0.01)
        return key

    runner: Runner[int, int, int] = Runner(concurrency=1, finish=lambda k, o, n: k)
    with runner:
        for key in range(6):
            runner.submit(key, lambda key=key: converse(key))  # type: ignore[misc]
        assert all_started.acquire(timeout=10)
        assert runner.in_flight == 1 and runner.queued == 5
        runner.resize(3)
        for _ in range(2):
            assert all_started.acquire(timeout=10)
        assert runner.in_flight == 3 and runner.queued == 3
        runner.resize(1)  # those in flight go on; nothing more is admitted
        assert runner.in_flight == 3 and runner.queued == 3 and started == [0, 1, 2]
        release.set()
        assert [runner.wait(key, timeout=10) for key in range(6)] == list(range(6))
