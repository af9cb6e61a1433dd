"""A script's expectations, judged on the turn's steps: which passed, which failed, and what
each failed one says it saw (in the verdict's message and the turn's record)."""

from __future__ import annotations

from typing import Any

import pytest

from pytest_haico.driver.expectations import EXCERPT_CHARS, describe_failure, excerpt
from pytest_haico.driver.transcripts import HEADER_KEY, is_header, transcript_header
from pytest_haico.ledger.records import ExpectationResult
from pytest_haico.ledger.verdicts import Verdict
from pytest_haico.redact import PLACEHOLDER
from tests.driver.driver_fakes import (
    TOKEN,
    Converse,
    FakeBackend,
    answer,
    complete,
    make_script,
    step,
    tool_call,
)

pytestmark = pytest.mark.asyncio

REFUSAL = "I cannot help with that, I am sorry."
WROTE = [
    step("", tool_calls=[tool_call("write_document")]),
    step("Wrote it.", message_type="tool", artifact={"type": "document"}),
    *answer("Done: your trip to Crete is in the document."),
]


async def judged(
    converse: Converse, expect: dict[str, Any], chunks: list[bytes], *, turns: int = 1
) -> tuple[Verdict, list[ExpectationResult], str | None]:
    """The verdict, the last turn's expectation results and the verdict's message."""
    script = make_script(*["Plan it."] * (turns - 1), {"user": "Plan a trip.", "expect": expect})
    replies = [answer("Here is the plan.")] * (turns - 1) + [chunks]
    done = await converse(FakeBackend(*replies), script)
    error = done.result.error.message if done.result.error is not None else None
    return done.result.verdict, list(done.result.turns[-1].expectations), error


@pytest.mark.parametrize(
    ("expect", "chunks"),
    [
        pytest.param({"contains": "Crete"}, answer("Three days on Crete."), id="contains"),
        pytest.param({"contains": ["Crete", "days"]}, answer("Three days on Crete."), id="all-of"),
        pytest.param({"matches": r"(?i)three\s+days"}, answer("THREE days."), id="matches"),
        pytest.param({"tool_called": "write_document"}, WROTE, id="tool-called"),
        pytest.param({"tool_not_called": "search"}, WROTE, id="tool-not-called"),
        pytest.param({"no_tool_error": True}, WROTE, id="no-tool-error"),
        pytest.param({"max_steps": 3}, WROTE, id="max-steps"),
        pytest.param({"artifact": True}, WROTE, id="artifact"),
        pytest.param({"artifact": False}, answer(), id="artifact-false-asks-nothing"),
    ],
)
async def test_a_met_expectation_completes_and_is_recorded_as_passed(
    converse: Converse, expect: dict[str, Any], chunks: list[bytes]
) -> None:
    verdict, results, _ = await judged(converse, expect, chunks)
    assert verdict is Verdict.COMPLETED
    assert [(r.expectation, r.passed) for r in results] == [
        (key, True) for key, value in expect.items() if value is not False
    ]


@pytest.mark.parametrize(
    ("expect", "chunks", "message"),
    [
        pytest.param(
            {"contains": "Crete"},
            answer(REFUSAL),
            f"turn 2: expected the answer to contain 'Crete', got {REFUSAL!r} (36 chars)",
            id="contains",
        ),
        pytest.param(
            {"contains": ["Crete", "Heraklion"]},
            answer("Three days on Crete."),
            "turn 2: expected the answer to contain 'Crete' and 'Heraklion', got "
            "'Three days on Crete.' (20 chars), without 'Heraklion'",
            id="all-of",
        ),
        pytest.param(
            {"matches": r"\d+ days"},
            answer("Three days."),
            "turn 2: expected the answer to match '\\\\d+ days', got 'Three days.' (11 chars)",
            id="matches",
        ),
        pytest.param(
            {"tool_called": "write_document"},
            answer(),
            "turn 2: expected a call of the tool 'write_document', got no tool call",
            id="tool-called",
        ),
        pytest.param(
            {"tool_not_called": "write_document"},
            WROTE,
            "turn 2: expected no call of the tool 'write_document', got calls of "
            "'write_document' (1x)",
            id="tool-not-called",
        ),
        pytest.param(
            {"no_tool_error": True},
            [
                step("", tool_calls=[tool_call("write_document")]),
                step("Error: title is required", message_type="tool", tool_error=True),
                *answer("Sorry."),
            ],
            "turn 2: expected no tool error, got 1 tool error, the first in step 2: "
            "'Error: title is required' (24 chars)",
            id="no-tool-error",
        ),
        pytest.param(
            {"max_steps": 2},
            WROTE,
            "turn 2: expected at most 2 steps, got 3 steps",
            id="max-steps",
        ),
        pytest.param(
            {"artifact": True},
            answer(),
            "turn 2: expected an artifact, got no artifact in 1 step",
            id="artifact",
        ),
    ],
)
async def test_a_missed_expectation_says_which_turn_which_expectation_and_what_was_seen(
    converse: Converse, expect: dict[str, Any], chunks: list[bytes], message: str
) -> None:
    verdict, results, error = await judged(converse, expect, chunks, turns=2)
    assert verdict is Verdict.EXPECTATION_FAILED
    assert error == message
    ((key, value),) = expect.items()
    (result,) = results
    assert (result.expectation, result.expected, result.passed) == (key, value, False)
    assert describe_failure(1, result) == message


async def test_every_expectation_of_a_turn_is_checked_and_the_first_missed_one_is_the_reason(
    converse: Converse,
) -> None:
    expect = {"contains": "Crete", "tool_called": "write_document", "max_steps": 5}
    verdict, results, error = await judged(converse, expect, answer(REFUSAL))
    assert verdict is Verdict.EXPECTATION_FAILED
    assert [(r.expectation, r.passed) for r in results] == [
        ("contains", False),
        ("tool_called", False),
        ("max_steps", True),
    ]
    assert error is not None and error.startswith("turn 1: expected the answer to contain")


async def test_expectations_are_recorded_even_when_a_worse_verdict_wins(
    converse: Converse,
) -> None:
    verdict, results, _ = await judged(converse, {"contains": "Crete"}, [step(""), complete()])
    assert verdict is Verdict.BLANK_TURN
    assert [(r.expectation, r.passed, r.seen) for r in results] == [
        ("contains", False, "'' (0 chars)")
    ]


async def test_a_secret_in_the_answer_is_redacted_where_the_expectation_shows_it(
    converse: Converse,
) -> None:
    verdict, results, error = await judged(converse, {"contains": "Crete"}, answer(TOKEN))
    assert verdict is Verdict.EXPECTATION_FAILED
    assert error is not None and TOKEN not in error
    assert TOKEN not in results[0].seen and PLACEHOLDER in results[0].seen


async def test_a_long_answer_is_cut_in_what_was_seen_and_its_length_given() -> None:
    text = "x" * (EXCERPT_CHARS + 30)
    assert excerpt(text) == f"'{'x' * EXCERPT_CHARS}…' ({EXCERPT_CHARS + 30} chars)"


async def test_the_answers_are_each_turns_final_text(converse: Converse) -> None:
    done = await converse(FakeBackend(answer("One."), WROTE), make_script("a", "b"))
    assert done.result.answers == ("One.", "Done: your trip to Crete is in the document.")


async def test_a_transcript_header_is_the_first_line_and_redacted(converse: Converse) -> None:
    header = transcript_header(item_id="ab" * 32, run_id="local-1.1", attempt=2, note=TOKEN)
    done = await converse(FakeBackend(answer()), transcript_header=header)
    first, *events = done.lines
    assert is_header(first) and not any(is_header(line) for line in events)
    assert first == {
        HEADER_KEY: 1,
        "item_id": "ab" * 32,
        "run_id": "local-1.1",
        "attempt": 2,
        "note": PLACEHOLDER,
    }
    assert events and all("kind" in line for line in events)
