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
from pytest_haico.files import shown_path
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


@pytest.mark.subprocess
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


@pytest.mark.subprocess
def test_compare_names_both_runs_and_the_items_only_one_side_has(
    campaign: CampaignProject,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    campaign.simple_scripts("alpha", "beta")
    campaign.write("test_conversations.py", CONVERSATION_MODULE)
    campaign.arm("demo", "[run]\nconcurrency = 2\n")
    first = campaign.run_subprocess("--haico-exit", "campaign", "--haico-campaign", "c")
    assert first.ret == 0, first.stdout.str()
    results = campaign.root / "results" / "c"
    (first_run,) = [p.stem for p in (results / "demo" / "ledger").glob("*.jsonl")]

    # One run: no previous one, said in one line that names the run there is.
    assert main(["compare", f"{results}@previous", f"{results}@latest"]) == 2
    assert capsys.readouterr().err == (
        f"haico: {results} holds one run ({first_run}), so there is no previous run: "
        f"run the campaign again, or compare with {results}@{first_run}\n"
    )

    # A second run of the same campaign, with one more script: only that item runs.
    campaign.simple_scripts("gamma")
    second = campaign.run_subprocess("--haico-exit", "campaign", "--haico-campaign", "c")
    assert second.ret == 0, second.stdout.str()
    (second_run,) = [
        p.stem for p in (results / "demo" / "ledger").glob("*.jsonl") if p.stem != first_run
    ]
    a, b = load_operand(f"{results}@previous"), load_operand(f"{results}@latest")
    assert {r.run_id for r in a.records} == {first_run}
    assert {r.run_id for r in b.records} == {second_run}
    ids = {r.script: (r.item_id, r.data["nodeid"]) for r in a.records + b.records}

    capsys.readouterr()  # the campaign runs' own output
    assert main(["compare", f"{results}@previous", f"{results}@{second_run}"]) == 0
    out = capsys.readouterr().out.splitlines()
    stamp = r"\(started \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC\)"
    where = shown_path(results)  # relative to the working directory
    assert re.fullmatch(rf"A: run {first_run} {stamp} in {where} \(2 items\)", out[0])
    assert re.fullmatch(rf"B: run {second_run} {stamp} in {where} \(1 items\)", out[1])
    assert out[2] == "0 script × repeat on both sides; 2 only in A, 1 only in B"
    assert out[3:6] == [
        f"  only in A: {ids['alpha'][0]}  {ids['alpha'][1]}",
        f"  only in A: {ids['beta'][0]}  {ids['beta'][1]}",
        f"  only in B: {ids['gamma'][0]}  {ids['gamma'][1]}",
    ]

    # The whole directory: both runs on one side, each named, oldest first.
    assert main(["compare", str(results), f"{results}@latest"]) == 0
    header = capsys.readouterr().out.splitlines()[0]
    assert re.fullmatch(
        rf"A: 2 runs {first_run} {stamp}, {second_run} {stamp} in {where} \(3 items\)", header
    )

    # Every item again (--haico-no-resume): @previous is the campaign before that run, both
    # earlier runs, so it pairs all three items; the names are under the results root.
    third = campaign.run_subprocess(
        "--haico-exit", "campaign", "--haico-campaign", "c", "--haico-no-resume"
    )
    assert third.ret == 0, third.stdout.str()
    before, after = load_operand(f"{results}@previous"), load_operand(f"{results}@latest")
    assert {r.run_id for r in before.records} == {first_run, second_run}
    assert {r.script for r in after.records} == {"alpha", "beta", "gamma"}
    capsys.readouterr()
    monkeypatch.chdir(campaign.root)
    assert main(["compare", "c/demo@previous", "c@latest"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"A: 2 runs {first_run} ")
    assert out[2] == "3 script × repeat on both sides; 0 only in A, 0 only in B"

    # A run id that is not there: one line naming the runs that are.
    assert main(["compare", f"{results}@nope", f"{results}@latest"]) == 2
    third_run = after.records[0].run_id
    assert capsys.readouterr().err == (
        f"haico: {results} holds no run 'nope': its runs are {first_run}, {second_run}, "
        f"{third_run} "
        f"(or give {results}@latest or {results}@previous)\n"
    )
