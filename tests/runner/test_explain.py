"""A finished conversation's explanation: the verdict once, the error's kind only when it
says something the verdict does not."""

from __future__ import annotations

from pytest_haico.driver.result import ConversationResult
from pytest_haico.ledger.records import ErrorInfo
from pytest_haico.ledger.times import AttemptTimes
from pytest_haico.ledger.verdicts import Verdict
from pytest_haico.runner.finished import Conversation
from tests.runner.arm_fakes import attempt


def explained(verdict: Verdict, error: ErrorInfo) -> str:
    result = ConversationResult(verdict, (), error, AttemptTimes.instant())
    return Conversation(attempt(1).spec, result, None).explain()


def test_an_error_whose_kind_is_the_verdict_names_the_verdict_once() -> None:
    error = ErrorInfo(kind="recursion_limit", message="turn 1 hit the recursion limit (12)")
    text = explained(Verdict.RECURSION_LIMIT, error)
    assert text == (
        "demo-script-1-r0: recursion_limit after 0 turn(s): turn 1 hit the recursion limit (12)"
    )
    assert text.count("recursion_limit") == 1


def test_an_error_of_another_kind_is_named_beside_the_verdict() -> None:
    error = ErrorInfo(kind="service_died", message="the backend exited 1")
    text = explained(Verdict.INFRA_ERROR, error)
    assert text == (
        "demo-script-1-r0: infra_error after 0 turn(s) (service_died: the backend exited 1)"
    )
