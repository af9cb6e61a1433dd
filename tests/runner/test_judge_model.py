"""pytest-haico's own judge over a served stand-in judge (persona judge, the real OpenAI wire):
yes and no as verdicts with the answer as received; a judge that answers neither, or cannot be
reached, is a `JudgeError` once its retries are spent."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_haico.driver.judging import JudgedTurn, JudgeVerdict
from pytest_haico.errors import JudgeError
from pytest_haico.runner import judge_model
from pytest_haico.runner.judge_model import ask_judge
from pytest_haico.serve.resolver import ServedModel, resolve_served
from tests.serve.judge_entries import register_judge, running
from tests.standins.standin_http import API_KEY, MODEL
from tests.standins.standin_procs import LlmServers, free_port


def _turn(question: str) -> JudgedTurn:
    answer = 'Here is a short answer about "Plan a three-day trip to Crete.": start there.'
    return JudgedTurn(question, "Plan a three-day trip to Crete.", answer, (), 0, "plan", "demo")


def _served(tmp_path: Path, port: int) -> ServedModel:
    catalogue = tmp_path / "catalogue"
    register_judge(catalogue, port=port, served_name=MODEL, key=API_KEY)
    return resolve_served("judge", catalogue=catalogue, lookup=running)


@pytest.fixture(autouse=True)
def _no_pause(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(judge_model, "RETRY_PAUSE_S", 0.0)


def test_the_served_judge_answers_yes_and_no(llm_server: LlmServers, tmp_path: Path) -> None:
    judge = _served(tmp_path, llm_server("judge").process.port)
    assert ask_judge(_turn('Does it mention "Crete"?'), judge) == JudgeVerdict(True, "Yes.")
    assert ask_judge(_turn('Does it mention "Rhodes"?'), judge) == JudgeVerdict(False, "No.")


def test_a_judge_answering_neither_yes_nor_no_is_a_judge_error(
    llm_server: LlmServers, tmp_path: Path
) -> None:
    judge = _served(tmp_path, llm_server("blank").process.port)
    with pytest.raises(JudgeError) as caught:
        ask_judge(_turn("Is it for three days?"), judge)
    assert str(caught.value) == (
        f"judge 'judge' at {judge.endpoint}/chat/completions (job 41), 3 attempts: answered "
        "'', neither yes nor no"
    )


def test_an_unreachable_judge_is_a_judge_error(tmp_path: Path) -> None:
    judge = _served(tmp_path, free_port())
    with pytest.raises(JudgeError, match=r"3 attempts: ConnectError: .*refused"):
        ask_judge(_turn("Is it for three days?"), judge)


def test_a_wrong_key_is_a_judge_error(llm_server: LlmServers, tmp_path: Path) -> None:
    catalogue = tmp_path / "catalogue"
    register_judge(catalogue, port=llm_server("judge").process.port, served_name=MODEL, key="x")
    judge = resolve_served("judge", catalogue=catalogue, lookup=running)
    with pytest.raises(JudgeError, match="3 attempts: HTTP 401"):
        ask_judge(_turn("Is it for three days?"), judge)
