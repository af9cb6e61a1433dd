"""kill -9 mid-campaign: every finished item keeps its record, and a rerun completes the rest."""

from __future__ import annotations

import json
import os
import re
import signal
from collections import Counter

import pytest

from tests.harness import CampaignProject

# Each test runs a child process (the fast loop, `-m "not slow"`, leaves them out).
pytestmark = pytest.mark.subprocess

ITEMS = 36
PASSED = re.compile(r"^experiments/test_conversations\.py::test_conversation\[(.+)\] PASSED")


@pytest.mark.parametrize("k", [3, 11, 23])
def test_kill_9_loses_no_finished_item(
    campaign: CampaignProject, monkeypatch: pytest.MonkeyPatch, k: int
) -> None:
    campaign.arm("demo")
    campaign.simple_scripts(*(f"s{i:02d}" for i in range(ITEMS)))
    monkeypatch.setenv("HAICO_TEST_ITEM_SECONDS", "0.3")
    process = campaign.start("-v")
    process.wait_for(
        lambda: len(campaign.ledger_lines("demo")) >= k,
        timeout=120,
        what=f"the ledger to reach {k} records",
    )
    os.kill(process.pid, signal.SIGKILL)
    assert process.wait(timeout=30) == -signal.SIGKILL

    shown_passed = {
        m.group(1) for line in process.output().splitlines() if (m := PASSED.match(line))
    }
    first = [json.loads(line) for line in campaign.ledger_lines("demo")]
    assert len(first) >= k
    assert len(first) < ITEMS, "the kill came after the campaign ended"
    recorded = {r["nodeid"].split("[")[1].rstrip("]") for r in first}
    assert shown_passed <= recorded, "an item shown PASSED has no record"

    rerun = campaign.run("-v")
    assert rerun.ret == 0, rerun.stdout.str()
    assert f"haico: {len(first)} done in ledger, {ITEMS - len(first)} to run" in rerun.stdout.str()

    final = [json.loads(line) for line in campaign.ledger_lines("demo")]
    assert all(record in final for record in first), "a valid record was lost"
    per_item = Counter(r["item_id"] for r in final if r["verdict"] == "completed")
    assert len(per_item) == ITEMS
    assert set(per_item.values()) == {1}, "an item was recorded twice"
