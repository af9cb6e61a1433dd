"""`haico cost` counts only the records of the current items: a script edited after a run
gives its items new ids, and the old records are stale (neither done nor measured)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from pytest_haico.report.item_costs import load_costs
from tests.harness import CampaignProject

SCRIPTS = ("a", "b", "c", "d", "e", "f")


def cost_report(campaign: CampaignProject) -> list[str]:
    report = subprocess.run(
        [sys.executable, "-m", "pytest_haico", "cost", "results/default"],
        cwd=campaign.root,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert report.returncode == 0, report.stderr
    return report.stdout.splitlines()


def line_of(lines: list[str], start: str) -> str:
    [found] = [line for line in lines if line.startswith(start)]
    return found


@pytest.mark.subprocess
def test_records_of_an_edited_script_are_stale_not_done(campaign: CampaignProject) -> None:
    campaign.arm("demo")
    campaign.simple_scripts(*SCRIPTS, stratum="s")
    campaign.run().assert_outcomes(passed=6)
    lines = cost_report(campaign)
    assert line_of(lines, "arm demo, stratum s: ").endswith(
        "all 6 items done, from 6 items: nothing to submit"
    )

    # Three scripts' turns change: their items are new, the three old records stale.
    campaign.simple_scripts(*SCRIPTS[:3], stratum="s")  # a.jsonl: a, b and c as they were
    campaign.simple_scripts(*SCRIPTS[3:], stratum="s", text="edited")
    lines = cost_report(campaign)
    # Not "all 6 items done" from 6 measured: 3 done, 3 measured (too few to project).
    assert line_of(lines, "arm demo, stratum s: ").startswith(
        "arm demo, stratum s: too few items to project: 3 measured, need 5"
    )
    assert "  remaining 3 of 6 items (3 done; 3 stale items not counted)" in lines

    campaign.run().assert_outcomes(passed=3)  # the three edited scripts' new items
    assert len(campaign.records("demo")) == 9
    lines = cost_report(campaign)
    assert line_of(lines, "arm demo, stratum s: ").endswith(
        "all 6 items done, from 6 items: nothing to submit"
    )


def test_a_current_item_counts_in_its_current_stratum(campaign: CampaignProject) -> None:
    campaign.arm("demo")
    campaign.simple_scripts("a", "b", stratum="old")
    campaign.run().assert_outcomes(passed=2)
    ids = {r["script"]: r["item_id"] for r in campaign.records("demo")}
    results = campaign.root / "results" / "default"
    # A script's stratum is no part of its items' ids: b moved to "new", a is gone and
    # an unrelated id stands in for an edit.
    current = {"demo": {ids["b"]: "new", "f" * 64: "old"}}
    costs = load_costs(results, warn=pytest.fail, current=current)
    assert (costs[("demo", "new")].done, costs[("demo", "new")].n) == (1, 1)
    old = costs[("demo", "old")]
    assert (old.done, old.n, old.stale) == (0, 0, 1)
    # An arm the current items do not name keeps every record.
    every = load_costs(results, warn=pytest.fail, current={})
    assert (every[("demo", "old")].done, every[("demo", "old")].stale) == (2, 0)
