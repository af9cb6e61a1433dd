"""`expect: {judge: ...}` in a conversation: what the judge is shown, its verdict and identity
in the turn's record, and a judge that cannot answer as infra, never a model failure."""

from __future__ import annotations

from typing import Any

import pytest

from pytest_haico.driver.judging import JudgedTurn, JudgeVerdict, ScoredTurn
from pytest_haico.errors import JudgeError
from pytest_haico.ledger.records import JudgeRecord
from pytest_haico.ledger.verdicts import Verdict
from pytest_haico.redact import PLACEHOLDER
from tests.driver.driver_fakes import TOKEN, Converse, FakeBackend, answer, make_script

pytestmark = pytest.mark.asyncio

QUESTION = "Is the plan for three days?"
IDENTITY = JudgeRecord(
    name="judge",
    served_name="qwen-judge",
    model={"kind": "hf", "hf_id": "Qwen/Q", "revision": "abc"},
    vllm_version="0.13.0",
    job_id="41",
    answer="",
)


class FakeScorer:
    """Answers every turn with `answer` (yes: passed), or raises `fail`; keeps the turns."""

    def __init__(self, answer: str = "Yes.", *, fail: Exception | None = None) -> None:
        self.answer = answer
        self.fail = fail
        self.turns: list[JudgedTurn] = []

    async def __call__(self, turn: JudgedTurn) -> ScoredTurn:
        self.turns.append(turn)
        if self.fail is not None:
            raise self.fail
        verdict = JudgeVerdict(passed=self.answer.startswith("Yes"), answer=self.answer)
        return ScoredTurn(verdict, IDENTITY.model_copy(update={"answer": self.answer}))


async def converse_judged(
    converse: Converse, scorer: FakeScorer | None, text: str = "Three days on Crete."
) -> Any:
    script = make_script("Hello.", {"user": "Plan a trip.", "expect": {"judge": QUESTION}})
    backend = FakeBackend(answer("Hi."), answer(text))
    return (await converse(backend, script, judge=scorer)).result


async def test_a_yes_passes_and_the_turn_records_the_judges_identity_and_answer(
    converse: Converse,
) -> None:
    scorer = FakeScorer("Yes.")
    result = await converse_judged(converse, scorer)
    assert result.verdict is Verdict.COMPLETED
    assert scorer.turns == [
        JudgedTurn(
            question=QUESTION,
            user="Plan a trip.",
            answer="Three days on Crete.",
            tool_calls=(),
            index=1,
            script="plan-trip",
            arm="qwen32b-tp2",
        )
    ]
    assert result.turns[0].expectations == ()
    (judged,) = result.turns[1].expectations
    assert (judged.expectation, judged.expected, judged.passed) == ("judge", QUESTION, True)
    assert judged.seen == "the judge 'judge' answered 'Yes.' (4 chars)"
    assert judged.judge == IDENTITY.model_copy(update={"answer": "Yes."})


async def test_a_no_is_an_expectation_failure_naming_question_and_answer(
    converse: Converse,
) -> None:
    result = await converse_judged(converse, FakeScorer("No, it is for two."))
    assert result.verdict is Verdict.EXPECTATION_FAILED
    assert result.error.message == (
        f"turn 2: expected the judge to answer yes to {QUESTION!r}, got the judge 'judge' "
        "answered 'No, it is for two.' (18 chars)"
    )
    assert result.turns[1].expectations[0].judge.answer == "No, it is for two."


async def test_a_judge_that_cannot_answer_is_infra_and_records_no_verdict(
    converse: Converse,
) -> None:
    failing = FakeScorer(fail=JudgeError("judge 'judge' at http://gpu07:8000/v1: ConnectError"))
    result = await converse_judged(converse, failing)
    assert result.verdict is Verdict.INFRA_ERROR
    assert result.error.kind == "judge"
    assert result.error.message == (
        f"turn 2: the judge could not answer {QUESTION!r}: judge 'judge' at "
        "http://gpu07:8000/v1: ConnectError"
    )
    assert result.turns[1].expectations == ()


async def test_a_crash_of_a_projects_judge_is_infra_too(converse: Converse) -> None:
    result = await converse_judged(converse, FakeScorer(fail=KeyError("answer")))
    assert (result.verdict, result.error.kind) == (Verdict.INFRA_ERROR, "judge")


async def test_a_turn_without_an_answer_is_not_put_to_the_judge(converse: Converse) -> None:
    scorer = FakeScorer()
    result = await converse_judged(converse, scorer, text="")
    assert result.verdict is Verdict.BLANK_TURN  # which outranks the failed question
    assert scorer.turns == []
    (judged,) = result.turns[1].expectations
    assert (judged.passed, judged.seen, judged.judge) == (False, "no answer to judge", None)


async def test_without_a_judge_the_expectation_is_infra(converse: Converse) -> None:
    result = await converse_judged(converse, None)
    assert (result.verdict, result.error.kind) == (Verdict.INFRA_ERROR, "judge")
    assert "no judge is configured" in result.error.message


async def test_a_secret_the_judge_repeats_is_redacted(converse: Converse) -> None:
    result = await converse_judged(converse, FakeScorer(f"Yes, and the token is {TOKEN}"))
    (judged,) = result.turns[1].expectations
    assert TOKEN not in judged.seen and TOKEN not in judged.judge.answer
    assert PLACEHOLDER in judged.judge.answer
