"""pytest-haico's hook specifications: what a project's top-level `conftest.py` (or a plugin)
may implement. Registered by `plugin.pytest_addhooks`."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pytest_haico.driver.judging import JudgedTurn, JudgeVerdict
    from pytest_haico.serve.resolver import ServedModel


@pytest.hookspec(firstresult=True)
def pytest_haico_judge_turn(turn: JudgedTurn, judge: ServedModel) -> JudgeVerdict | None:
    """Score one turn's `expect: {judge: question}`: whether `turn.answer` passes
    `turn.question`.

    :param turn: the question, the user's message, the answer (the final step's text), the
        tools the turn called, its index from 0, the script's id and the arm's name.
    :param judge: the judge's served model as the catalogue resolved it for this attempt:
        `endpoint`, `served_name`, `identity`, `entry.job.id`, and `api_key()`.

    Return a `JudgeVerdict(passed, answer)`, or None to leave the turn to the next
    implementation; pytest-haico's own (it asks the judge model for yes or no) runs last.
    Raise `pytest_haico.errors.JudgeError` when the judge cannot answer: the attempt is then
    infra_error, retried by a later run, never a model failure. Called from a worker thread
    while other conversations go on, so an implementation may block, but must be
    thread-safe.
    """
