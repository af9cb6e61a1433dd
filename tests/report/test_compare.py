"""`haico compare` on two campaigns the stand-ins really ran, differing in one knob: the
stand-in model's persona, helpful in the baseline and blank in the other."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_haico.cli.main import main
from pytest_haico.report.compare import compare_lines, load_operand
from tests.harness import CONVERSATION_MODULE, CampaignProject

# Items: `greet` and `notes` complete under persona helpful; `unasked` expects an artifact
# from a turn that asks for none, so it fails under either persona.
SCRIPTS = [
    {"id": "greet", "repeats": 2, "turns": [{"user": "Hello there."}]},
    {
        "id": "notes",
        "turns": [
            {"user": "Plan a meeting."},
            {"user": "Write it up as a document.", "expect": {"artifact": True}},
        ],
    },
    {"id": "unasked", "turns": [{"user": "Say hi.", "expect": {"artifact": True}}]},
]


def run_campaign(campaign: CampaignProject, name: str, persona: str) -> Path:
    campaign.arm("demo", f'[run]\nconcurrency = 4\n[standin]\npersona = "{persona}"\n')
    run = campaign.run_subprocess("--haico-exit", "campaign", "--haico-campaign", name)
    assert run.ret == 0, run.stdout.str()
    return campaign.root / "results" / name


def test_compare_finds_exactly_the_regressions_the_persona_causes(
    campaign: CampaignProject, capsys: pytest.CaptureFixture[str]
) -> None:
    campaign.scripts("s.jsonl", "".join(json.dumps(s) + "\n" for s in SCRIPTS))
    campaign.write("test_conversations.py", CONVERSATION_MODULE)
    helpful = run_campaign(campaign, "helpful", "helpful")
    blank = run_campaign(campaign, "blank", "blank")

    a, b = load_operand(str(helpful)), load_operand(str(blank))
    assert {(r.script, r.repeat): r.verdict for r in a.newest()} == {
        ("greet", 0): "completed",
        ("greet", 1): "completed",
        ("notes", 0): "completed",
        ("unasked", 0): "expectation_failed",
    }
    lines, regressions = compare_lines(a, b)
    assert regressions == 3
    assert "regressions (completed in A, not in B): 3" in lines
    rows = [line for line in lines if line.endswith("]")]
    # Regressions first, then the item that changed but had not completed before.
    assert [row.split()[1] for row in rows] == ["greet-r0", "greet-r1", "notes-r0", "unasked-r0"]
    assert [row.rsplit("[", 1)[1] for row in rows] == ["regression]"] * 3 + ["changed]"]
    assert all(re.search(r" completed +blank_turn ", row) for row in rows[:3])
    assert "other verdict changes: 1; improvements (completed only in B): 0; unchanged: 0" in lines
    assert "  ARM_STANDIN_PERSONA: A helpful  →  B blank" in lines
    assert any(line.startswith("  tokens out: 4 item(s) used fewer in B") for line in lines)

    assert main(["compare", str(helpful), str(blank), "--exit-on-regression"]) == 1
    assert main(["compare", str(blank), str(helpful), "--exit-on-regression"]) == 0
    assert main(["compare", str(helpful), str(helpful), "--exit-on-regression"]) == 0
    out = capsys.readouterr().out
    assert "regressions (completed in A, not in B): 0" in out
    assert "provenance: 0 run-config key(s) differ" in out

    # A run named by its id, as a command in a script would.
    run_id = a.records[0].run_id
    command = [
        sys.executable,
        "-m",
        "pytest_haico",
        "compare",
        f"{helpful}@{run_id}",
        str(blank / "demo"),
        "--exit-on-regression",
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stderr
    assert "regressions (completed in A, not in B): 3" in done.stdout


def test_compare_of_a_path_that_is_no_campaign_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["compare", str(tmp_path), str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"haico: {tmp_path} holds no <arm>/ledger/ directory: give <results>/<campaign> (it "
        "holds <arm>/ledger/), <campaign>/<arm>, <arm>/runs/<run_id> or "
        "<arm>/ledger/<run_id>.jsonl\n"
    )
