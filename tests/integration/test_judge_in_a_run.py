"""A campaign whose scripts ask a judge, with the stand-ins: the judge is a stand-in model
(persona judge) served by this test and registered in the catalogue; a project's conftest.py
scores the questions it claims; a judge that cannot be reached makes the item infra_error."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pytest_haico.cli.main import main
from tests.harness import CONVERSATION_MODULE, CampaignProject
from tests.serve.judge_entries import register_judge, scontrol_shim
from tests.standins.standin_http import API_KEY, MODEL
from tests.standins.standin_procs import LlmServers, free_port

# Persona helpful answers 'Here is a short answer about "<the user's turn>": ...', and persona
# judge says yes when the answer holds every phrase the question quotes.
SCRIPTS = """
- id: judged-yes
  turns:
    - user: "Plan a three-day trip to Crete."
      expect: {judge: 'Does the answer mention "Crete"?'}
- id: judged-no
  turns:
    - user: "Plan a three-day trip to Crete."
      expect: {judge: 'Does the answer mention "Rhodes"?'}
- id: judged-by-the-project
  turns:
    - user: "Hello."
      expect: {judge: "Is the answer polite? (the project's)"}
- id: unjudged
  turns:
    - user: "Hello."
"""

# The project's own scorer: the questions it claims, without a model; the rest it leaves.
CONFTEST = """
from pytest_haico.driver.judging import JudgeVerdict


def pytest_haico_judge_turn(turn, judge):
    if turn.question.endswith("(the project's)"):
        return JudgeVerdict(passed=True, answer=f"conftest: polite, {len(turn.answer)} chars")
    return None
"""


Records = dict[str, dict[str, dict[str, Any]]]


@dataclass
class JudgedRun:
    records: Records  # arm -> script -> its ledger record
    results: Path  # the campaign's results directory


@pytest.fixture(scope="module")
def _runs() -> list[JudgedRun]:
    """Holds the campaign's one run, made by the first test that asks for it."""
    return []


@pytest.fixture
def run(
    _runs: list[JudgedRun],
    campaign: CampaignProject,
    llm_server: LlmServers,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> JudgedRun:
    """One run: arm `demo` judged by `judge` (the stand-in), arm `lost` by `gone` (whose
    entry points at a port where nothing answers); each arm's records by script."""
    if _runs:
        return _runs[0]
    catalogue = campaign.root / "catalogue"  # <rootdir>/catalogue without CLUSTER_WORK
    judge = llm_server("judge")
    register_judge(catalogue, port=judge.process.port, served_name=MODEL, key=API_KEY)
    register_judge(catalogue, port=free_port(), served_name=MODEL, key=API_KEY, name="gone")
    scontrol_shim(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{Path('/usr/bin')}:{Path('/bin')}")
    campaign.pytester.makeconftest(CONFTEST)
    campaign.write("test_conversations.py", CONVERSATION_MODULE)
    campaign.scripts("judged.yaml", SCRIPTS)
    campaign.arm("demo", "[run]\njudge = 'judge'\n")
    campaign.arm("lost", "[run]\njudge = 'gone'\n")
    result = campaign.run_subprocess("-q", timeout=600)
    assert result.ret == 1, result.stdout.str() + result.stderr.str()
    records = {arm: {r["script"]: r for r in campaign.records(arm)} for arm in ("demo", "lost")}
    _runs.append(JudgedRun(records, campaign.root / "results" / "default"))
    return _runs[0]


@pytest.fixture
def records(run: JudgedRun) -> Records:
    return run.records


def _judged(record: dict[str, Any]) -> dict[str, Any]:
    expectations: list[dict[str, Any]] = record["turns"][0]["expectations"]
    (judged,) = expectations
    assert judged["expectation"] == "judge"
    return judged


def test_the_judges_verdicts_are_recorded_with_its_identity_and_answer(
    records: Records,
) -> None:
    demo = records["demo"]
    assert demo["judged-yes"]["verdict"] == "completed"
    judged = _judged(demo["judged-yes"])
    assert (judged["expected"], judged["passed"]) == ('Does the answer mention "Crete"?', True)
    assert judged["judge"] == {
        "name": "judge",
        "served_name": MODEL,
        "model": {
            "kind": "path",
            "path": "/models/judge",
            "config_sha256": "a" * 64,
            "shard_index": "model.safetensors.index.json",
            "shard_index_sha256": "b" * 64,
        },
        "vllm_version": "0.13.0",
        "job_id": "41",
        "answer": "Yes.",
    }
    record = demo["judged-no"]
    assert (record["verdict"], record["outcome"]) == ("expectation_failed", "failed")
    assert _judged(record)["judge"]["answer"] == "No."
    assert record["error"]["message"] == (
        "turn 1: expected the judge to answer yes to 'Does the answer mention \"Rhodes\"?', got "
        "the judge 'judge' answered 'No.' (3 chars)"
    )
    assert "judge" not in str(demo["unjudged"]["turns"])


def test_a_projects_conftest_scores_the_questions_it_claims(
    records: Records,
) -> None:
    for arm in ("demo", "lost"):  # the project's scorer needs no model: `gone` is not asked
        record = records[arm]["judged-by-the-project"]
        assert record["verdict"] == "completed"
        assert _judged(record)["judge"]["answer"].startswith("conftest: polite, ")


def test_a_judge_that_cannot_be_reached_is_infra_not_a_model_failure(
    records: Records,
) -> None:
    lost = records["lost"]
    for script in ("judged-yes", "judged-no"):
        record = lost[script]
        assert (record["verdict"], record["outcome"]) == ("infra_error", "error")
        assert record["error"]["kind"] == "judge"
        assert record["error"]["message"].startswith("turn 1: the judge could not answer ")
        assert "judge 'gone' at http://127.0.0.1:" in record["error"]["message"]
        assert record["turns"][0]["expectations"] == []
    assert lost["unjudged"]["verdict"] == "completed"


def test_show_names_the_judge_and_what_it_answered(
    run: JudgedRun, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["show", "demo-judged-no-r0", "--campaign", str(run.results)]) == 0
    assert (
        '  expect judge "Does the answer mention \\"Rhodes\\"?": FAIL (judge judge, job 41: "No.")'
        in capsys.readouterr().out.splitlines()
    )


def test_gate_judge_resolved_each_arms_judge_before_its_stack_started(run: JudgedRun) -> None:
    for arm, judge in (("demo", "judge"), ("lost", "gone")):
        (gates_json,) = (run.results / arm / "runs").glob("*/gates.json")
        gates = json.loads(gates_json.read_text())["gates"]
        names = [gate["name"] for gate in gates]
        assert names.index("judge") < names.index("completion"), names  # static: first
        (gate,) = [gate for gate in gates if gate["name"] == "judge"]
        assert gate["passed"] and gate["detail"].startswith(f"'{judge}' at http://127.0.0.1:")
