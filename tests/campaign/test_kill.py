"""kill -9 mid-campaign: every finished item keeps its record, and a rerun completes the rest."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.campaign.conftest import CampaignDir

ITEMS = 36
PASSED = re.compile(r"^experiments/test_conversations\.py::test_conversation\[(.+)\] PASSED")


def complete_lines(ledger_dir: Path) -> list[bytes]:
    lines: list[bytes] = []
    for path in sorted(ledger_dir.glob("*.jsonl")):
        data = path.read_bytes()
        lines.extend(data.split(b"\n")[:-1])  # the part after the last newline may be torn
    return [line for line in lines if line.strip()]


def pytest_command() -> list[str]:
    return [sys.executable, "-u", "-m", "pytest", "experiments", "-v", "-p", "no:cacheprovider"]


@pytest.mark.parametrize("k", [3, 11, 23])
def test_kill_9_loses_no_finished_item(campaign: CampaignDir, tmp_path: Path, k: int) -> None:
    campaign.arm("demo")
    campaign.simple_scripts(*(f"s{i:02d}" for i in range(ITEMS)))
    ledger_dir = campaign.root / "results" / "default" / "demo" / "ledger"
    env = {**os.environ, "HAICO_TEST_ITEM_SECONDS": "0.3"}
    output = tmp_path / "first-run.out"
    with open(output, "wb") as out:
        process = subprocess.Popen(
            pytest_command(), cwd=campaign.root, env=env, stdout=out, stderr=subprocess.STDOUT
        )
        deadline = time.monotonic() + 120
        while len(complete_lines(ledger_dir) if ledger_dir.exists() else []) < k:
            assert process.poll() is None, output.read_text()
            assert time.monotonic() < deadline, "the ledger never reached k records"
            time.sleep(0.02)
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=30)
    assert process.returncode == -signal.SIGKILL

    shown_passed = {
        m.group(1) for line in output.read_text().splitlines() if (m := PASSED.match(line))
    }
    first = [json.loads(line) for line in complete_lines(ledger_dir)]
    assert len(first) >= k
    assert len(first) < ITEMS, "the kill came after the campaign ended"
    recorded = {r["nodeid"].split("[")[1].rstrip("]") for r in first}
    assert shown_passed <= recorded, "an item shown PASSED has no record"

    rerun = subprocess.run(
        pytest_command(), cwd=campaign.root, env=env, capture_output=True, text=True, timeout=300
    )
    assert rerun.returncode == 0, rerun.stdout
    assert f"haico: {len(first)} done in ledger, {ITEMS - len(first)} to run" in rerun.stdout

    final = [json.loads(line) for line in complete_lines(ledger_dir)]
    assert all(record in final for record in first), "a valid record was lost"
    per_item = Counter(r["item_id"] for r in final if r["verdict"] == "completed")
    assert len(per_item) == ITEMS
    assert set(per_item.values()) == {1}, "an item was recorded twice"
