"""A turn's `expect: {judge: ...}`: what the judge is shown (`JudgedTurn`), what it answers
(`JudgeVerdict`), and how its scoring becomes the turn's expectation result or an infra
finding. The judge itself is the runner's (`Scorer`): the driver knows no model of it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from pytest_haico.config.experiment import Turn
from pytest_haico.driver.expectations import describe_failure, excerpt
from pytest_haico.driver.judge import Finding, TurnState, make_finding
from pytest_haico.ledger.records import ExpectationResult, JudgeRecord
from pytest_haico.ledger.verdicts import Verdict
from pytest_haico.redact import Redactor


@dataclass(frozen=True, slots=True)
class JudgedTurn:
    """One turn as the judge is asked about it (the hook's `turn`): the script's `question`,
    the user's message, the answer (the final step's text), the tools the turn called, and
    where it is (`index` from 0, the script's id, the arm's name)."""

    question: str
    user: str
    answer: str
    tool_calls: tuple[str, ...]
    index: int
    script: str
    arm: str


@dataclass(frozen=True, slots=True)
class JudgeVerdict:
    """What an implementation of `pytest_haico_judge_turn` returns: whether the turn passes
    the question, and the judge's answer as received (recorded with the verdict)."""

    passed: bool
    answer: str


@dataclass(frozen=True, slots=True)
class ScoredTurn:
    """A verdict with the identity of the judge that gave it."""

    verdict: JudgeVerdict
    judge: JudgeRecord


class Scorer(Protocol):
    """Scores one turn's judge question; raises (an `InfraError`, e.g. `JudgeError`) when the
    judge cannot answer, which makes the attempt infra, never a model failure."""

    async def __call__(self, turn: JudgedTurn) -> ScoredTurn: ...


async def score_judge(
    scorer: Scorer | None,
    turn: Turn,
    state: TurnState,
    redactor: Redactor,
    *,
    arm: str,
    script: str,
) -> list[Finding]:
    """The turn's judge expectation checked by `scorer`, its result kept in `state` (what the
    judge said redacted like the rest of `seen`); a finding when it did not pass
    (expectation_failed) or the judge could not answer (infra_error, and no result).

    A turn without an answer is not put to the judge: it fails the question as it stands.
    """
    assert turn.expect is not None and turn.expect.judge is not None
    question = turn.expect.judge
    answer = state.answer
    if not answer.strip():
        result = _result(question, passed=False, seen="no answer to judge", judge=None)
    elif scorer is None:
        message = f"turn {state.index + 1}: no judge is configured for its judge expectation"
        return [make_finding(Verdict.INFRA_ERROR, message, kind="judge")]
    else:
        judged = JudgedTurn(
            question=question,
            user=turn.user,
            answer=answer,
            tool_calls=tuple(name for step in state.steps for name in step.tool_names),
            index=state.index,
            script=script,
            arm=arm,
        )
        try:
            scored = await scorer(judged)
        except Exception as exc:  # a judge, or a project's hook, that cannot answer is infra
            text = redactor.redact(str(exc) or type(exc).__name__)
            message = f"turn {state.index + 1}: the judge could not answer {question!r}: {text}"
            return [make_finding(Verdict.INFRA_ERROR, message, kind="judge")]
        said = redactor.redact(scored.verdict.answer)
        judge = scored.judge.model_copy(update={"answer": said})
        seen = f"the judge {judge.name!r} answered {excerpt(said)}"
        result = _result(question, passed=scored.verdict.passed, seen=seen, judge=judge)
    state.expectations.append(result)
    if result.passed:
        return []
    return [make_finding(Verdict.EXPECTATION_FAILED, describe_failure(state.index, result))]


def _result(
    question: str, *, passed: bool, seen: str, judge: JudgeRecord | None
) -> ExpectationResult:
    return ExpectationResult(
        expectation="judge", expected=question, passed=passed, seen=seen, judge=judge
    )
