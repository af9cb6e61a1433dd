"""The walltime gate in a run: a job with less time left than one measured item costs is a
cost shortfall, not a fault of the inputs, so it exits 75 (resubmit with more time), never
78 ("fix the inputs"), in both exit modes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.harness import CONVERSATION_MODULE, CampaignProject

# squeue as a job sees it: this job ends two minutes from now.
SQUEUE = '#!/bin/bash\necho "7 $(date -d "+2 min" +%Y-%m-%dT%H:%M:%S)"\n'


@pytest.fixture
def short_job(campaign: CampaignProject, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """An arm whose earlier items took 10 min each, one conversation still owed, and a Slurm
    job (7) that ends in 2 min. (The earlier items ran without a stack, the gate refuses
    before the stack would start.)"""
    campaign.arm("demo")
    campaign.simple_scripts("s1", "s2")
    assert campaign.run().ret == 0
    [ledger] = campaign.ledger_files("demo")
    records = [json.loads(line) for line in ledger.read_text().splitlines()]
    ledger.write_text("".join(json.dumps({**r, "duration_s": 600.0}) + "\n" for r in records))
    campaign.simple_scripts("s1", "s2", "s3")
    campaign.write("test_conversations.py", CONVERSATION_MODULE)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "squeue").write_text(SQUEUE)
    (bin_dir / "squeue").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{Path('/usr/bin')}:{Path('/bin')}")
    monkeypatch.setenv("SLURM_JOB_ID", "7")


@pytest.mark.parametrize("mode", ["campaign", "strict"])
@pytest.mark.usefixtures("short_job")
def test_too_little_time_for_one_item_exits_75_saying_it_is_a_cost_shortfall(
    campaign: CampaignProject, mode: str
) -> None:
    result = campaign.run("--haico-exit", mode, "--haico-drain-timeout", "10")
    assert result.ret == 75, result.stdout.str()
    result.stdout.fnmatch_lines(
        [
            "too little time left (exit 75: a cost shortfall, the inputs are fine): arm demo: "
            "gate walltime failed: the job ends in * s; the slowest item of stratum default "
            "took 10 min + 40 s drain margin = 11 min: not even that item could finish; "
            "resubmit with a longer --time (at least 11 min; *"
        ]
    )
    assert "(exit 78)" not in result.stdout.str()
    assert [r["script"] for r in campaign.records("demo")] == ["s1", "s2"]  # s3 never ran
