"""A judge expectation that cannot be scored is one line: at configure time, exit 4, no judge
named, an empty question, a malformed name; at the start of the arm's run, gate judge (exit
78, before any service starts), a judge the catalogue does not have."""

from __future__ import annotations

import pytest

from tests.harness import CONVERSATION_MODULE, CampaignProject
from tests.serve.judge_entries import register_judge

SCRIPT = """
id: judged
turns:
  - user: "Hello."
  - user: "Plan a three-day trip to Crete."
    expect: {judge: %s}
"""


def _usage_error(campaign: CampaignProject, *args: str) -> str:
    result = campaign.run(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()
    (line,) = [line for line in result.stderr.lines if line.startswith("ERROR: ")]
    return line


def test_a_judge_question_without_a_judge_names_script_line_and_fix(
    campaign: CampaignProject,
) -> None:
    campaign.scripts("judged.yaml", SCRIPT % "'Is the plan for three days?'")
    campaign.arm("demo")
    line = _usage_error(campaign)
    assert line == (
        f"ERROR: haico: {campaign.experiments / 'scripts' / 'judged.yaml'}: turn 2, "
        "expect.judge: arm demo has no judge to ask: name the served judge model with "
        '--haico-judge NAME (or the arm\'s [run] judge = "NAME"; `haico serve --list` shows '
        "what is served)"
    )


def _gate_failure(campaign: CampaignProject, *args: str) -> str:
    """The line of a run that stopped at a static gate (exit 78), before any service."""
    campaign.write("test_conversations.py", CONVERSATION_MODULE)
    result = campaign.run(*args)
    assert result.ret == 78, result.stdout.str()
    (line,) = [line for line in result.stdout.lines if line.startswith("gate failed (exit 78)")]
    assert campaign.records("demo") == []
    return line


def test_a_judge_the_catalogue_does_not_have_is_gate_78_naming_what_is_served(
    campaign: CampaignProject,
) -> None:
    register_judge(campaign.root / "catalogue", port=1, served_name="j", key="k")
    campaign.scripts("judged.yaml", SCRIPT % "'Is the plan for three days?'")
    campaign.arm("demo")
    assert _gate_failure(campaign, "--haico-judge", "jduge") == (
        "gate failed (exit 78): arm demo: gate judge failed: no served model named 'jduge' in "
        f"{campaign.root / 'catalogue'} (served there: judge); start it with `haico serve "
        "<arm> --name jduge`; serve it, or name another judge with --haico-judge or [run] "
        "judge; then rerun"
    )


def test_an_arms_judge_without_a_catalogue_is_gate_78(campaign: CampaignProject) -> None:
    campaign.scripts("judged.yaml", SCRIPT % "'Is the plan for three days?'")
    campaign.arm("demo", "[run]\njudge = 'judge'\n")
    line = _gate_failure(campaign)
    assert line.startswith("gate failed (exit 78): arm demo: gate judge failed: ")
    assert "no catalogue here: no model is served (`haico serve <arm>` serves one)" in line


@pytest.mark.parametrize(
    ("question", "problem"),
    [("''", "String should have at least 1 character"), ("'  '", "must not be blank")],
)
def test_an_empty_question_is_refused(
    campaign: CampaignProject, question: str, problem: str
) -> None:
    campaign.scripts("judged.yaml", SCRIPT % question)
    campaign.arm("demo")
    line = _usage_error(campaign, "--haico-judge", "judge")
    assert "judged.yaml: turn 2, expect.judge: " + problem in line


def test_a_malformed_judge_name_is_refused(campaign: CampaignProject) -> None:
    campaign.simple_scripts("s1")
    campaign.arm("demo")
    line = _usage_error(campaign, "--haico-judge", "Judge!")
    assert line == (
        "ERROR: haico: --haico-judge: 'Judge!' is not a served model's name: use [a-z0-9_.] "
        "with inner '-'"
    )


def test_a_campaign_without_judge_questions_ignores_the_judge(campaign: CampaignProject) -> None:
    campaign.simple_scripts("s1")
    campaign.arm("demo")
    assert campaign.run("--haico-judge", "nowhere").ret == 0
