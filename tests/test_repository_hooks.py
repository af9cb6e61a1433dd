"""This repository's conftest.py implements the judge hook: questions it can count it answers,
the rest it leaves to the judge model."""

from __future__ import annotations

import pytest

from pytest_haico.driver.judging import JudgedTurn, JudgeVerdict


def _turn(question: str, answer: str) -> JudgedTurn:
    return JudgedTurn(question, "Plan it.", answer, (), 0, "plan", "demo")


def test_the_repositorys_conftest_counts_words_and_leaves_the_rest(
    pytestconfig: pytest.Config,
) -> None:
    (conftest,) = [
        impl.function
        for impl in pytestconfig.hook.pytest_haico_judge_turn.get_hookimpls()
        if impl.plugin_name.endswith("conftest.py")
    ]
    question = "Is the answer under 5 words?"
    assert conftest(turn=_turn(question, "Three days on Crete."), judge=None) == JudgeVerdict(
        True, "Yes: 4 words (conftest.py counted)"
    )
    assert conftest(turn=_turn(question, "One two three four five."), judge=None) == (
        JudgeVerdict(False, "No: 5 words (conftest.py counted)")
    )
    assert conftest(turn=_turn("Is the plan for three days?", "Yes."), judge=None) is None
