"""A run's pg_dumps: periodic ones rotated, a final one, never another run's removed."""

from __future__ import annotations

from tests.harness import CampaignProject
from tests.signals.conftest import dumps, restorable, stack_campaign

SLOW_ARM = """
[run]
concurrency = 1
[standin]
latency_ms = 700
"""


def test_a_run_keeps_its_newest_periodic_dump_and_a_final_one_and_leaves_earlier_runs_dumps(
    campaign: CampaignProject,
) -> None:
    stack_campaign(campaign, SLOW_ARM, items=6)
    first = campaign.run_subprocess("--haico-dump-interval", "1")
    assert first.ret == 0, first.stdout.str()
    (run_1,) = sorted((campaign.arm_dir("demo") / "runs").iterdir())
    periodic, final = dumps(run_1, "periodic"), dumps(run_1, "final")
    assert len(periodic) == 1 and len(final) == 1  # the older periodic ones were removed
    assert restorable(periodic[0]) and restorable(final[0])
    assert periodic[0].stat().st_mode & 0o777 == 0o640
    assert (run_1 / "dumps").stat().st_mode & 0o777 == 0o750
    first.stdout.fnmatch_lines([f"  dumps:       {(run_1 / 'dumps').relative_to(campaign.root)}"])
    before = sorted(p.name for p in (run_1 / "dumps").iterdir())

    again = campaign.run_subprocess("--haico-no-resume", "--haico-dump-interval", "1")
    assert again.ret == 0, again.stdout.str()
    runs = sorted((campaign.arm_dir("demo") / "runs").iterdir())
    assert len(runs) == 2
    assert sorted(p.name for p in (run_1 / "dumps").iterdir()) == before
    (run_2,) = (r for r in runs if r != run_1)
    assert len(dumps(run_2, "final")) == 1


def test_interval_0_writes_the_final_dump_only(campaign: CampaignProject) -> None:
    stack_campaign(campaign, SLOW_ARM, items=3)
    result = campaign.run_subprocess("--haico-dump-interval", "0")
    assert result.ret == 0, result.stdout.str()
    (run,) = sorted((campaign.arm_dir("demo") / "runs").iterdir())
    assert dumps(run, "periodic") == []
    assert len(dumps(run, "final")) == 1
