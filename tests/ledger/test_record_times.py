"""An attempt's times in its record, from their one owner (`ledger.times`): the
conversation's own start and monotonic duration whatever the item's pytest hooks did
meanwhile, the finish their sum, never a negative duration nor a finish before the start."""

from __future__ import annotations

import json
import math
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from pytest_haico.config.slurm import SlurmJob
from pytest_haico.ledger.recorder import ItemAttempt, Recorder
from pytest_haico.ledger.times import AttemptTimes, Stopwatch
from pytest_haico.ledger.verdicts import Verdict
from tests.harness import CONVERSATION_MODULE, CampaignProject
from tests.ledger.test_ledger_with_a_stack import quick_scripts
from tests.ledger.test_schemas import demo_spec

BEGAN = datetime(2026, 12, 2, 1, 0, 0, tzinfo=UTC)


def record_with(tmp_path: Path, state: ItemAttempt | None = None, **times: Any) -> dict[str, Any]:
    recorder = Recorder(
        campaign_dir=tmp_path / "results" / "default",
        campaign="default",
        job=SlurmJob.from_environ({}),
        max_attempts=3,
    )
    try:
        state = state or ItemAttempt(demo_spec(tmp_path), "experiments/t.py::test[x]", attempt=1)
        recorder.record(state, Verdict.COMPLETED, **times)
        (path,) = recorder.ledger_paths().values()
    finally:
        recorder.close()
    record: dict[str, Any] = json.loads(path.read_bytes())
    return record


def test_the_conversation_times_win_over_a_later_pytest_start(tmp_path: Path) -> None:
    # pytest reached the item (its protocol hook started the attempt's clock) after the
    # conversation, which ran ahead in the event loop, had finished: the race that wrote a
    # negative duration.
    state = ItemAttempt(demo_spec(tmp_path), "experiments/t.py::test[x]", attempt=1)
    state.clock.start()
    record = record_with(tmp_path, state, times=AttemptTimes(BEGAN, 1.4999))
    assert record["started_at"] == "2026-12-02T01:00:00.000000+00:00"
    assert record["finished_at"] == "2026-12-02T01:00:01.499900+00:00"
    assert record["duration_s"] == 1.4999


def test_without_the_conversation_times_the_span_is_from_the_pytest_start(
    tmp_path: Path,
) -> None:
    state = ItemAttempt(demo_spec(tmp_path), "experiments/t.py::test[x]", attempt=1)
    state.clock.start()
    record = record_with(tmp_path, state)
    started = datetime.fromisoformat(record["started_at"])
    finished = datetime.fromisoformat(record["finished_at"])
    assert started == state.clock.started_at
    assert record["duration_s"] >= 0
    assert finished - started == timedelta(seconds=record["duration_s"])


def test_an_attempt_pytest_never_started_records_a_zero_length_span(tmp_path: Path) -> None:
    record = record_with(tmp_path)
    assert record["duration_s"] == 0.0
    assert record["started_at"] == record["finished_at"]


def test_a_stopwatch_keeps_its_first_start() -> None:
    clock = Stopwatch()
    clock.start()
    first = clock.started_at
    clock.start()  # pytest's hook, after the conversation began
    assert clock.started_at == first
    times = clock.read()
    assert times.started_at == first
    assert times.duration_s >= 0
    assert times.finished_at == first + timedelta(seconds=times.duration_s)


def test_a_stopwatch_never_started_reads_a_zero_length_span_now() -> None:
    before = datetime.now(UTC)
    times = Stopwatch().read()
    assert times.duration_s == 0.0
    assert times.finished_at == times.started_at >= before


def test_a_stopwatch_started_and_read_from_many_threads_is_never_inverted() -> None:
    clocks = [Stopwatch() for _ in range(200)]
    reads: list[AttemptTimes] = []
    lock = threading.Lock()

    def start_and_read(clock: Stopwatch) -> None:
        clock.start()
        times = clock.read()
        with lock:
            reads.append(times)

    threads = [threading.Thread(target=start_and_read, args=(c,)) for c in clocks for _ in "ab"]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(reads) == 400
    assert all(t.duration_s >= 0 and t.finished_at >= t.started_at for t in reads)
    # Each clock has one start, whichever thread came first.
    assert len({t.started_at for t in reads}) <= 200


@pytest.mark.parametrize("duration", [-0.054, -1e308, math.nan])
def test_a_span_refuses_a_negative_duration(duration: float) -> None:
    with pytest.raises(ValueError, match="a duration is never negative"):
        AttemptTimes(BEGAN, duration)


@pytest.mark.subprocess
def test_many_fast_items_in_flight_record_no_negative_or_inverted_duration(
    campaign: CampaignProject,
) -> None:
    # The race's shape: 60 conversations of a few milliseconds each, 16 at a time, run
    # ahead of pytest reaching their items on the main thread.
    campaign.arm("demo", "[run]\nconcurrency = 16\n")
    campaign.scripts("a.jsonl", quick_scripts(60))
    campaign.write("test_conversations.py", CONVERSATION_MODULE)
    result = campaign.run_subprocess()
    assert result.ret == 0, result.stdout.str()
    records = campaign.records("demo")
    assert len(records) == 60
    for record in records:
        started = datetime.fromisoformat(record["started_at"])
        finished = datetime.fromisoformat(record["finished_at"])
        assert record["duration_s"] >= 0, record
        assert finished >= started, record
        assert abs((finished - started).total_seconds() - record["duration_s"]) < 1e-5, record


def test_a_conversation_cancelled_before_it_began_has_a_zero_length_span() -> None:
    # Before one owner, its duration was the monotonic clock's whole reading (since boot).
    from pytest_haico.driver.conversation import ConversationProgress

    result = ConversationProgress().interrupted_result()
    assert result.verdict is Verdict.INTERRUPTED
    assert result.duration_s == 0.0
    assert result.finished_at == result.started_at
