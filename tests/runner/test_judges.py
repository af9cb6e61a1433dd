"""The judge of `expect: {judge: ...}`: the script's question as parsed, which judge an arm
has (checked at configure time), the scorer resolving it in the catalogue and recording its
identity, and the hook's dispatch (a project's conftest.py answers first)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from pytest_haico.config.experiment import Arm, Script, ScriptSource
from pytest_haico.driver.judging import JudgedTurn, JudgeVerdict
from pytest_haico.errors import ConfigError, JudgeError
from pytest_haico.ledger.records import JudgeRecord
from pytest_haico.runner.judge_model import judge_messages, parse_verdict
from pytest_haico.runner.judges import TurnJudge, check_judges
from pytest_haico.serve.resolver import ServedModel
from pytest_haico.slurm.records import JobRecord
from tests.harness import PYPROJECT
from tests.serve.judge_entries import JUDGE_MODEL, register_judge, running

TURN = JudgedTurn(
    question='Does the answer mention "Crete"?',
    user="Plan a three-day trip to Crete.",
    answer="Three days on Crete.",
    tool_calls=(),
    index=0,
    script="plan",
    arm="demo",
)


def _source(*expects: dict[str, Any] | None, line: int = 3) -> ScriptSource:
    turns = [{"user": "Plan it.", **({"expect": e} if e else {})} for e in expects]
    script = Script.model_validate({"id": "plan", "turns": turns})
    return ScriptSource(script, Path("experiments/scripts/plan.yaml"), 1, "0" * 64, line)


def _arm(name: str = "demo", **run: Any) -> Arm:
    return Arm.model_validate({"name": name, "run": run})


@pytest.fixture
def catalogue(tmp_path: Path) -> Path:
    return tmp_path / "work" / "catalogue"


@pytest.mark.parametrize(
    ("text", "verdict"),
    [("Yes.", True), ("**No**, it is for two", False), ('"YES"', True), ("Yesterday", None)],
)
def test_the_judges_verdict_is_its_first_word(text: str, verdict: bool | None) -> None:
    assert parse_verdict(text) is verdict


def test_the_judge_reads_the_question_first_and_the_answer_last() -> None:
    system, user = judge_messages(TURN)
    assert system["role"] == "system" and "yes or no" in system["content"]
    lines = user["content"].splitlines()
    assert lines[0] == TURN.question and lines[-1] == TURN.answer
    assert TURN.user in lines


def test_scripts_without_a_judge_question_need_no_judge() -> None:
    names = check_judges([_arm()], [_source({"contains": "x"})], option=None)
    assert names == {}


def test_a_judge_question_without_a_judge_names_the_script_and_the_fix() -> None:
    with pytest.raises(ConfigError) as caught:
        check_judges([_arm()], [_source(None, {"judge": "Q?"})], option=None)
    message = str(caught.value)
    assert message.startswith("experiments/scripts/plan.yaml:3")
    assert "turn 2, expect.judge: arm demo has no judge to ask: name the served judge model " in (
        message
    )
    assert "--haico-judge NAME" in message and '[run] judge = "NAME"' in message


def test_the_option_names_every_arms_judge_and_the_arm_its_own() -> None:
    arms = [_arm("a"), _arm("b", judge="strict-judge")]
    source = _source({"judge": "Q?"})
    assert check_judges(arms, [source], option="judge") == {
        "a": "judge",
        "b": "judge",
    }
    with pytest.raises(ConfigError, match="arm a has no judge"):
        check_judges(arms, [source], option=None)
    assert check_judges(arms[1:], [source], option=None) == {"b": "strict-judge"}


def _judge(catalogue: Path, hook: Any, lookup: Any = running, name: str = "judge") -> TurnJudge:
    return TurnJudge(name, catalogue=catalogue, hook=hook, lookup=lookup)


def test_gate_judge_refuses_an_unknown_judge_naming_what_is_served(catalogue: Path) -> None:
    register_judge(catalogue, port=1, served_name="j", key="k", name="judge")
    result = _judge(catalogue, lambda **_: None, name="jduge").gate()
    assert (result.name, result.passed) == ("judge", False)
    assert result.detail == (
        f"no served model named 'jduge' in {catalogue} (served there: judge); "
        "start it with `haico serve <arm> --name jduge`"
    )
    assert "--haico-judge or [run] judge" in result.fix


def test_gate_judge_refuses_a_judge_whose_job_ended_and_passes_a_running_one(
    catalogue: Path,
) -> None:
    register_judge(catalogue, port=8011, served_name="j", key="k")
    stale = _judge(catalogue, lambda **_: None, lambda job_id: None).gate()
    assert not stale.passed and "its job 41 has ended" in stale.detail
    live = _judge(catalogue, lambda **_: None).gate()
    assert live.passed and live.detail == "'judge' at http://127.0.0.1:8011/v1, job 41"


def test_the_scorer_records_the_judges_identity_and_answer(catalogue: Path) -> None:
    register_judge(catalogue, port=8011, served_name="qwen-judge", key="sk-judge")
    asked: list[tuple[JudgedTurn, ServedModel]] = []

    def hook(*, turn: JudgedTurn, judge: ServedModel) -> JudgeVerdict:
        asked.append((turn, judge))
        return JudgeVerdict(passed=True, answer="Yes.")

    scored = asyncio.run(_judge(catalogue, hook)(TURN))
    assert scored.verdict == JudgeVerdict(passed=True, answer="Yes.")
    assert scored.judge == JudgeRecord(
        name="judge",
        served_name="qwen-judge",
        model={
            "kind": "path",
            "path": "/models/judge",
            "config_sha256": "a" * 64,
            "shard_index": "model.safetensors.index.json",
            "shard_index_sha256": "b" * 64,
        },
        vllm_version="0.13.0",
        job_id="41",
        answer="Yes.",
    )
    ((turn, judge),) = asked
    assert turn == TURN and judge.endpoint == "http://127.0.0.1:8011/v1"
    assert judge.identity.model == JUDGE_MODEL and judge.api_key() == "sk-judge"


def test_no_implementation_answering_is_a_judge_error(catalogue: Path) -> None:
    register_judge(catalogue, port=8011, served_name="j", key="k")
    with pytest.raises(JudgeError, match="returned no implementation answered"):
        asyncio.run(_judge(catalogue, lambda **_: None)(TURN))


def test_a_stale_judge_is_a_judge_error(catalogue: Path) -> None:
    register_judge(catalogue, port=8011, served_name="j", key="k")

    def ended(job_id: str) -> JobRecord | None:
        return None

    with pytest.raises(JudgeError, match="its job 41 has ended"):
        asyncio.run(_judge(catalogue, lambda **_: None, ended)(TURN))


def test_after_a_failure_the_judge_is_resolved_again(catalogue: Path) -> None:
    # The judge's job was requeued to another port: the call that failed on the old endpoint
    # makes the next one resolve the catalogue again, and find the new entry.
    register_judge(catalogue, port=8011, served_name="j", key="k", job="41")
    endpoints: list[str] = []

    def hook(*, turn: JudgedTurn, judge: ServedModel) -> JudgeVerdict:
        endpoints.append(judge.endpoint)
        if judge.entry.job.id == "41":
            raise JudgeError("unreachable")
        return JudgeVerdict(passed=False, answer="No.")

    scorer = _judge(catalogue, hook)
    with pytest.raises(JudgeError):
        asyncio.run(scorer(TURN))
    register_judge(catalogue, port=8012, served_name="j", key="k", job="42")
    assert asyncio.run(scorer(TURN)).judge.job_id == "42"
    assert endpoints == ["http://127.0.0.1:8011/v1", "http://127.0.0.1:8012/v1"]


CONFTEST = """
from pytest_haico.driver.judging import JudgeVerdict


def pytest_haico_judge_turn(turn, judge):
    if turn.question.endswith("(the project's)"):
        return JudgeVerdict(passed=True, answer="conftest: " + turn.answer)
    return None
"""

DISPATCH = """
import pytest

from pytest_haico.driver.judging import JudgedTurn
from pytest_haico.errors import JudgeError
from pytest_haico.runner.judge_model import JUDGE_PLUGIN, JudgeModelPlugin
from pytest_haico.serve.catalogue import CatalogueEntry
from pytest_haico.serve.resolver import ServedModel


def turn(question):
    return JudgedTurn(question, "Plan it.", "Three days.", (), 0, "plan", "demo")


class Unreachable:
    name = "judge"
    endpoint = "http://127.0.0.1:9/v1"
    served_name = "judge"

    class entry:
        class job:
            id = "41"

    def api_key(self):
        return "k"


@pytest.fixture(autouse=True)
def default_judge(pytestconfig):
    pytestconfig.pluginmanager.register(JudgeModelPlugin(), JUDGE_PLUGIN)
    yield
    pytestconfig.pluginmanager.unregister(name=JUDGE_PLUGIN)


def test_the_conftest_answers_first(pytestconfig):
    hook = pytestconfig.hook.pytest_haico_judge_turn
    verdict = hook(turn=turn("Polite? (the project's)"), judge=Unreachable())
    assert (verdict.passed, verdict.answer) == (True, "conftest: Three days.")


def test_what_the_conftest_leaves_goes_to_the_judge_model(pytestconfig, monkeypatch):
    monkeypatch.setattr("pytest_haico.runner.judge_model.RETRY_PAUSE_S", 0.0)
    hook = pytestconfig.hook.pytest_haico_judge_turn
    with pytest.raises(JudgeError, match="judge 'judge' at http://127.0.0.1:9/v1/chat"):
        hook(turn=turn("Three days?"), judge=Unreachable())
"""


def test_a_conftest_implementation_wins_over_the_judge_model(pytester: pytest.Pytester) -> None:
    pytester.makepyprojecttoml(PYPROJECT)
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_dispatch=DISPATCH)
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)
