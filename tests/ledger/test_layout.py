"""The results layout's one owner: every path of a campaign's results, and each reversed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pytest_haico.config.shard import Shard
from pytest_haico.ledger.layout import (
    ArmPaths,
    TranscriptName,
    arm_of_ledger,
    arm_of_run_dir,
    iter_arm_dirs,
    parse_transcript_name,
    run_dir_of_ledger,
    run_id_of_ledger,
)


def _campaign(tmp_path: Path) -> tuple[Path, ArmPaths]:
    campaign = tmp_path / "results" / "default"
    arm = ArmPaths(campaign / "demo")
    for directory in (arm.ledger_dir, arm.transcripts_dir, arm.run_dir("4711.1")):
        directory.mkdir(parents=True)
    (campaign / "submissions" / "ledger").mkdir(parents=True)  # never an arm
    (campaign / "notes").mkdir()
    return campaign, arm


def test_an_arms_paths_and_their_reverses(tmp_path: Path) -> None:
    campaign, arm = _campaign(tmp_path)
    ledger = arm.ledger("4711.1")
    assert ledger == campaign / "demo" / "ledger" / "4711.1.jsonl"
    assert run_id_of_ledger(ledger) == "4711.1"
    assert arm_of_ledger(ledger) == arm
    assert arm_of_ledger(campaign / "demo" / "runs" / "4711.1.jsonl") is None
    assert run_dir_of_ledger(ledger) == arm.run_dir("4711.1") == campaign / "demo/runs/4711.1"
    assert arm_of_run_dir(arm.run_dir("4711.1")) == arm
    assert arm_of_run_dir(campaign / "notes") is None
    transcript = arm.transcript("ab" * 32, "4711.1", 2)
    assert transcript.parent == campaign / "demo" / "transcripts"
    assert parse_transcript_name(transcript.name) == TranscriptName("ab" * 32, "4711.1", 2)
    assert parse_transcript_name("notes.txt") is None
    assert parse_transcript_name("x.4711.1.two.jsonl") is None
    claim = arm.share_claim(Shard(1, 4), "long", list_key="k")
    assert claim == campaign / "demo" / "claims" / "shard-1of4.items-k.long.json"


def test_a_campaigns_arms_are_its_directories_with_a_ledger_but_submissions(
    tmp_path: Path,
) -> None:
    campaign, arm = _campaign(tmp_path)
    (arm.ledger_dir / "4711.1.jsonl").write_text("")
    (arm.ledger_dir / "notes.txt").write_text("")
    assert list(iter_arm_dirs(campaign)) == [arm.root]
    assert arm.ledger_names() == ["4711.1.jsonl"]


@pytest.mark.subprocess
def test_the_layout_imports_no_pydantic() -> None:
    # The results API, the report and haico validate import it: none may pay for pydantic.
    probe = (
        "import sys, pytest_haico.ledger.layout; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'pydantic'))"
    )
    shown = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert shown.stdout == "[]\n", shown.stderr
