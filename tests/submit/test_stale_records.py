"""`haico submit --stage full` sizes its jobs from the current items' records only: records
of item ids an edit has left behind are neither done nor measured (as in `haico cost`)."""

from __future__ import annotations

import json

import pytest

from tests.submit.campaign import Campaign

# Every `campaign.haico(...)` is a real `haico` process.
pytestmark = pytest.mark.subprocess


def _stale_records(campaign: Campaign, count: int) -> None:
    """Completed records of stratum long whose item ids no current item has (a script
    edited since they ran), each 100 s long."""
    ledger = campaign.campaign_dir / "demo" / "ledger" / "local-old.1.jsonl"
    ledger.parent.mkdir(parents=True, exist_ok=True)
    with ledger.open("w") as handle:
        for n in range(count):
            record = {
                "schema": 2,
                "stratum": "long",
                "item_id": f"{n:064x}",
                "attempt": 1,
                "verdict": "completed",
                "started_at": f"2025-01-01T00:00:{n:02d}Z",
                "finished_at": f"2025-01-01T00:01:{n:02d}Z",
                "duration_s": 100.0,
            }
            handle.write(json.dumps(record) + "\n")


def test_the_full_stage_counts_and_measures_only_the_current_items(campaign: Campaign) -> None:
    _stale_records(campaign, 8)  # as many as stratum long has items, more than cost needs
    campaign.smoke_long()
    full = campaign.haico("submit", "demo", "--stage", "full", "--stratum", "long", "--dry-run")
    assert full.returncode == 0, full.stderr
    said = full.stdout + full.stderr
    # The smoke task's two items are all that is measured: too few to size the array by.
    assert "nothing measured yet" in said, said
    assert "items measured" not in said, said
