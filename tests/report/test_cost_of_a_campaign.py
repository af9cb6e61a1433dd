"""`haico cost` on a campaign the stand-ins really ran: two strata whose items take known
times (one and three completions of a stand-in answering after 200 ms)."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time

import pytest

from pytest_haico.report.item_costs import load_costs
from tests.harness import CONVERSATION_MODULE, CampaignProject

# Each test runs a child process (the fast loop, `-m "not slow"`, leaves them out).
pytestmark = pytest.mark.subprocess

LATENCY_S = 0.2


def test_the_cost_of_each_stratum_follows_its_known_item_time(campaign: CampaignProject) -> None:
    campaign.arm(
        "demo", f"[run]\nconcurrency = 4\n[standin]\nlatency_ms = {LATENCY_S * 1000:.0f}\n"
    )
    scripts = [
        {
            "id": f"{stratum}{i}",
            "stratum": stratum,
            "turns": [{"user": f"q{k} of {i}"} for k in range(turns)],
        }
        for stratum, turns in (("one", 1), ("three", 3))
        for i in range(6)
    ]
    campaign.scripts("s.jsonl", "".join(json.dumps(s) + "\n" for s in scripts))
    campaign.write("test_conversations.py", CONVERSATION_MODULE)
    began = time.monotonic()
    run = campaign.run_subprocess("--haico-exit", "campaign", "--haico-limit-per-stratum", "5")
    ran_s = time.monotonic() - began
    assert run.ret == 0, run.stdout.str()

    costs = load_costs(campaign.root / "results" / "default", warn=pytest.fail)
    one, three = costs[("demo", "one")], costs[("demo", "three")]
    assert (one.n, three.n, one.done, three.done) == (5, 5, 5, 5)
    # The figures are the ledger's item times; every completion waits for the stand-in's
    # latency, the rest is the harness's.
    times = {
        stratum: [r["duration_s"] for r in campaign.records("demo") if r["stratum"] == stratum]
        for stratum in ("one", "three")
    }
    assert one.median_s == statistics.median(times["one"])
    assert three.median_s == statistics.median(times["three"])
    assert min(times["one"]) >= LATENCY_S and min(times["three"]) >= 3 * LATENCY_S
    # The stack's start-up (Postgres, the stand-ins, the gates) was measured for the arm,
    # within the run.
    assert one.startup_s is not None and 0 < one.startup_s < ran_s
    assert one.startup_s == three.startup_s

    report = subprocess.run(
        [sys.executable, "-m", "pytest_haico", "cost", "results/default"],
        cwd=campaign.root,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert report.returncode == 0, report.stderr
    lines = report.stdout.splitlines()
    # One item of each stratum is left: a one-task array of the shortest rung.
    for stratum in ("one", "three"):
        head = f"arm demo, stratum {stratum}: "
        [headline] = [line for line in lines if line.startswith(head)]
        assert headline.endswith("from 5 items: ask --array=0-0 --time=00:15:00"), headline
    assert any(line.startswith("  remaining 1 of 6 items (5 done)") for line in lines)
    assert sum("s/item, p95" in line for line in lines) == 2
