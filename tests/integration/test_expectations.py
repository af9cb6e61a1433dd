"""Expectations judged on real conversations with the stand-ins: the verdict, what the ledger
record says of each expectation, and `Conversation.explain()`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from tests.harness import CampaignProject

# The user's test module: besides asserting, it keeps what `explain()` says of each item.
MODULE = """
from pathlib import Path

from pytest_haico import Conversation, Verdict

EXPLAINED = Path(__file__).parent.parent / "explained"


def test_conversation(haico_conversation: Conversation) -> None:
    EXPLAINED.mkdir(exist_ok=True)
    (EXPLAINED / haico_conversation.spec.test_id).write_text(haico_conversation.explain())
    assert haico_conversation.verdict is Verdict.COMPLETED, haico_conversation.explain()
"""

# The helpful persona repeats the turn's topic in its answer, and calls its one tool,
# write_document (a tool call, the tool's message, the answer: 3 steps), when a turn asks
# for a document; persona bad_args calls it with arguments that fail validation.
SCRIPTS = """
- id: contains-met
  turns:
    - user: "Plan a three-day trip to Crete."
      expect: {contains: Crete, matches: "(?i)three-day"}
- id: contains-missed
  turns:
    - user: "Hello, who are you?"
    - user: "Tell me a joke."
      expect: {contains: [joke, Crete]}
- id: tool-called
  turns:
    - user: "Write it up as a document."
      expect: {tool_called: write_document, artifact: true, no_tool_error: true, max_steps: 3}
- id: tool-not-called
  turns:
    - user: "Save the packing list as a file."
      expect: {tool_not_called: write_document}
- id: too-many-steps
  turns:
    - user: "Draft a short report."
      expect: {max_steps: 2}
- id: no-tool-error
  turns:
    - user: "Write the budget down as a document."
      expect: {no_tool_error: true}
"""

ARMS = {
    "helpful": "[standin]\npersona = 'helpful'\n",
    "bad_args": "[agent]\nrecursion_limit = 6\n[standin]\npersona = 'bad_args'\n",
}


@dataclass
class ExpectationRun:
    result: pytest.RunResult
    records: dict[str, dict[str, dict[str, Any]]]  # arm -> script -> its ledger record
    explained: dict[str, str]  # test id -> explain()


@pytest.fixture(scope="module")
def _runs() -> list[ExpectationRun]:
    """Holds the campaign's one run, made by the first test that asks for it."""
    return []


@pytest.fixture
def run(_runs: list[ExpectationRun], campaign: CampaignProject) -> ExpectationRun:
    if not _runs:
        campaign.write("test_conversations.py", MODULE)
        campaign.scripts("cases.yaml", SCRIPTS)
        for name, text in ARMS.items():
            campaign.arm(name, text)
        result = campaign.run_subprocess("-q", timeout=600)
        records = {arm: {r["script"]: r for r in campaign.records(arm)} for arm in ARMS}
        explained = {p.name: p.read_text() for p in (campaign.root / "explained").iterdir()}
        _runs.append(ExpectationRun(result, records, explained))
    (done,) = _runs
    assert done.result.ret == 1, done.result.stdout.str() + done.result.stderr.str()
    return done


def expectations(record: dict[str, Any], turn: int) -> list[tuple[str, Any, bool]]:
    return [
        (e["expectation"], e["expected"], e["passed"])
        for e in record["turns"][turn]["expectations"]
    ]


def test_met_expectations_complete_and_are_recorded_as_passed(run: ExpectationRun) -> None:
    helpful = run.records["helpful"]
    assert helpful["contains-met"]["verdict"] == "completed"
    assert expectations(helpful["contains-met"], 0) == [
        ("contains", "Crete", True),
        ("matches", "(?i)three-day", True),
    ]
    assert helpful["tool-called"]["verdict"] == "completed"
    assert expectations(helpful["tool-called"], 0) == [
        ("artifact", True, True),
        ("tool_called", "write_document", True),
        ("no_tool_error", True, True),
        ("max_steps", 3, True),
    ]


def test_a_missed_contains_fails_and_says_turn_expectation_and_answer(
    run: ExpectationRun,
) -> None:
    record = run.records["helpful"]["contains-missed"]
    assert (record["verdict"], record["outcome"]) == ("expectation_failed", "failed")
    assert record["turns"][0]["expectations"] == []
    (missed,) = record["turns"][1]["expectations"]
    assert (missed["expectation"], missed["expected"], missed["passed"]) == (
        "contains",
        ["joke", "Crete"],
        False,
    )
    assert missed["seen"].endswith(" chars), without 'Crete'")
    assert "Tell me a joke." in missed["seen"]
    message = record["error"]["message"]
    assert message.startswith(
        "turn 2: expected the answer to contain 'joke' and 'Crete', got 'On \"Tell me a joke.\""
    )
    assert run.explained["helpful-contains-missed-r0"] == (
        f"helpful-contains-missed-r0: expectation_failed after 2 turn(s): {message}"
    )


def test_a_tool_called_against_the_expectation_fails(run: ExpectationRun) -> None:
    record = run.records["helpful"]["tool-not-called"]
    assert record["verdict"] == "expectation_failed"
    assert record["error"]["message"] == (
        "turn 1: expected no call of the tool 'write_document', got calls of 'write_document' (1x)"
    )


def test_more_steps_than_expected_fail(run: ExpectationRun) -> None:
    record = run.records["helpful"]["too-many-steps"]
    assert record["verdict"] == "expectation_failed"
    assert record["error"]["message"] == "turn 1: expected at most 2 steps, got 3 steps"


def test_a_tool_error_is_recorded_and_explained_under_the_verdict_that_wins(
    run: ExpectationRun,
) -> None:
    # Bad arguments loop into the recursion limit, which outranks expectation_failed; the
    # missed expectation is still in the record, and explain() lists it under the verdict.
    record = run.records["bad_args"]["no-tool-error"]
    assert record["verdict"] == "recursion_limit"
    (missed,) = record["turns"][0]["expectations"]
    assert (missed["expectation"], missed["passed"]) == ("no_tool_error", False)
    assert missed["seen"].startswith(f"{record['turns'][0]['tool_errors']} tool errors, ")
    first, second = run.explained["bad_args-no-tool-error-r0"].splitlines()
    # The error's kind is the verdict: said once.
    assert first.startswith("bad_args-no-tool-error-r0: recursion_limit after 1 turn(s): turn 1 ")
    assert second.startswith("  turn 1: expected no tool error, got ")


def test_the_demo_vocabulary_is_what_the_record_shows(run: ExpectationRun) -> None:
    # Every expectation of every turn is in the record, in the order the script's keys
    # have in `Expect`, whatever the verdict.
    keys = {
        script: [e["expectation"] for t in record["turns"] for e in t["expectations"]]
        for script, record in run.records["bad_args"].items()
    }
    assert keys["tool-called"] == ["artifact", "tool_called", "no_tool_error", "max_steps"]
    assert keys["contains-met"] == ["contains", "matches"]
