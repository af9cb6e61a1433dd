"""A judge served by `haico serve` under real Slurm daemons (the stand-in model's persona
`judge`, from an arm kept out of the campaign's arms): a campaign's judge questions are
answered by it and recorded with its job; once it is stopped, the next run is refused by
gate judge (exit 78) before anything starts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pytest_haico.cli.main import main
from pytest_haico.errors import CatalogueError
from pytest_haico.serve.resolver import resolve_served
from tests.polling import wait_for
from tests.slurm.cluster import SlurmCluster

JUDGE_ARM = """\
description = "A judge: the stand-in model's judge persona"

[model]
served_name = "judge"

[slurm]
time = "00:10:00"

[standin]
persona = "judge"
"""
# Persona helpful answers 'Here is a short answer about "<the user's turn>": ...'; persona
# judge says yes when the answer holds every phrase the question quotes.
SCRIPTS = """\
- id: crete-judged
  turns:
    - user: "Plan a three-day trip to Crete."
      expect: {judge: 'Does the answer mention "Crete"?'}
    - user: "Now make it a week on Rhodes."
      expect: {judge: 'Does the answer still mention "Crete"?'}
"""


@pytest.fixture
def project(
    slurm_cluster: SlurmCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Path]:
    """`haico init`'s repository with a judged script and the judge's arm in judges/, its
    CLUSTER_WORK under tmp_path, Slurm's commands pointed at the test cluster."""
    root = tmp_path / "project"
    subprocess.run(
        [sys.executable, "-m", "pytest_haico", "init", str(root)], check=True, capture_output=True
    )
    (root / "judges" / "arms").mkdir(parents=True)
    (root / "judges" / "arms" / "judge.toml").write_text(JUDGE_ARM)
    (root / "experiments" / "scripts" / "judged.yaml").write_text(SCRIPTS)
    monkeypatch.chdir(root)
    monkeypatch.setenv("CLUSTER_WORK", str(tmp_path / "work"))
    for key, value in slurm_cluster.env.items():
        monkeypatch.setenv(key, value)
    yield root
    for job in slurm_cluster.run(
        "squeue", "-h", "-n", "haico.serve.judge", "-o", "%i"
    ).stdout.split():
        slurm_cluster.run("scancel", job)


def _serve(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    status = main(["serve", *args])
    captured = capsys.readouterr()
    assert status == 0, captured.out + captured.err
    return captured.out + captured.err


def _campaign(project: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "experiments", "--haico-exit", "campaign",
         "--haico-judge", "judge"],
        cwd=project, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def _records(arm: str = "standin") -> dict[str, dict[str, Any]]:
    ledger = Path(os.environ["CLUSTER_WORK"]) / "results" / "default" / arm / "ledger"
    records = [
        json.loads(line)
        for path in sorted(ledger.glob("*.jsonl"))
        for line in path.read_text().splitlines()
        if line.strip()
    ]
    return {record["script"]: record for record in records}


def test_a_served_judge_scores_a_campaign_and_once_stopped_is_refused_by_gate_judge(
    project: Path, slurm_cluster: SlurmCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    out = _serve(capsys, "judge", "--experiments", "judges", "--profile", "local", "--time", "5")
    job = out.split("submitted job ", 1)[1].split()[0]
    catalogue = Path(os.environ["CLUSTER_WORK"]) / "catalogue"

    def registered() -> bool:
        try:
            return resolve_served("judge", catalogue=catalogue).entry.job.id == job
        except CatalogueError:
            return False

    wait_for(registered, timeout=120, what="the judge's job to register")

    run = _campaign(project)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    record = _records()["crete-judged"]
    assert record["verdict"] == "expectation_failed", record
    verdicts = [turn["expectations"][0] for turn in record["turns"]]
    assert [(v["passed"], v["judge"]["answer"]) for v in verdicts] == [
        (True, "Yes."),
        (False, "No."),
    ]
    for verdict in verdicts:
        judge = verdict["judge"]
        assert (judge["name"], judge["served_name"], judge["job_id"]) == ("judge", "judge", job)
        assert judge["model"]["persona"] == "judge"

    assert _serve(capsys, "stop", "judge").splitlines()[-1] == "haico: 'judge' deregistered"
    slurm_cluster.wait_ended(job, timeout=60)
    recorded = len(_records())
    # A new question is a new item: the next run would ask the judge, and is refused first.
    (project / "experiments" / "scripts" / "rhodes.yaml").write_text(
        SCRIPTS.replace("crete-judged", "rhodes-judged").replace('"Crete"?', '"Rhodes"?')
    )
    refused = _campaign(project)
    assert refused.returncode == 78, refused.stdout[-3000:] + refused.stderr[-3000:]
    assert (
        "gate failed (exit 78): arm standin: gate judge failed: no served model named 'judge' "
        f"in {catalogue} (served there: none)" in refused.stdout
    ), refused.stdout[-3000:]
    assert len(_records()) == recorded
