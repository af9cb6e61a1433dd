"""An attempt's times in its record: the conversation's own start and monotonic duration,
whatever the item's pytest hooks set meanwhile, and never a negative duration."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from pytest_haico.config.slurm import SlurmJob
from pytest_haico.ledger.recorder import ItemAttempt, Recorder
from pytest_haico.ledger.verdicts import Verdict
from tests.ledger.test_schemas import demo_spec

FINISHED = datetime(2026, 12, 2, 1, 0, 0, tzinfo=UTC)


def record_with(tmp_path: Path, *, state_started: datetime, **times: Any) -> dict[str, Any]:
    recorder = Recorder(
        campaign_dir=tmp_path / "results" / "default",
        campaign="default",
        job=SlurmJob.from_environ({}),
        max_attempts=3,
    )
    try:
        state = ItemAttempt(demo_spec(tmp_path), "experiments/t.py::test[x]", attempt=1)
        state.started_at = state_started
        recorder.record(state, Verdict.COMPLETED, finished_at=FINISHED, **times)
        (path,) = recorder.ledger_paths().values()
    finally:
        recorder.close()
    record: dict[str, Any] = json.loads(path.read_bytes())
    return record


def test_the_conversation_times_win_over_a_later_pytest_start(tmp_path: Path) -> None:
    # pytest reached the item (its protocol hook set the state's start) after the
    # conversation, which ran ahead in the event loop, had finished: the race that wrote a
    # negative duration.
    began = FINISHED - timedelta(seconds=1.5)
    record = record_with(
        tmp_path,
        state_started=FINISHED + timedelta(seconds=2),
        started_at=began,
        duration_s=1.4999,
    )
    assert record["started_at"] == began.isoformat(timespec="microseconds")
    assert record["duration_s"] == 1.4999


def test_a_start_after_the_finish_records_a_zero_duration(tmp_path: Path) -> None:
    record = record_with(tmp_path, state_started=FINISHED + timedelta(seconds=2))
    assert record["duration_s"] == 0.0


def test_without_the_conversation_times_the_duration_is_start_to_finish(tmp_path: Path) -> None:
    record = record_with(tmp_path, state_started=FINISHED - timedelta(seconds=3))
    assert record["duration_s"] == 3.0
