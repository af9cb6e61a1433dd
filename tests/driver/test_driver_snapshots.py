"""Snapshot rows as the driver sees them."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from pytest_haico.driver.snapshots import snapshot_from_row


def test_row_ids_of_any_sql_type_become_strings() -> None:
    sid = uuid.uuid4()
    row = {
        "snapshot_id": sid,
        "thread_id": "t",
        "turn_index": 3,
        "branch_from": 1,
        "provider": "vllm",
        "model_id": "qwen32b",
        "created_at": datetime(2025, 1, 1, tzinfo=UTC),
        "workspace": {"files": []},
    }
    snapshot = snapshot_from_row(row)
    assert snapshot.snapshot_id == str(sid)
    assert (snapshot.turn_index, snapshot.branch_from) == (3, 1)
    assert snapshot.is_served_by(provider="vllm", model_id="qwen32b")
    assert not snapshot.is_served_by(provider="openai", model_id="qwen32b")


def test_missing_optional_columns_are_none() -> None:
    snapshot = snapshot_from_row({"snapshot_id": 1, "thread_id": "t", "turn_index": 0})
    assert (snapshot.branch_from, snapshot.provider, snapshot.model_id) == (None, None, None)
    assert not snapshot.is_served_by(provider="vllm", model_id="qwen32b")
