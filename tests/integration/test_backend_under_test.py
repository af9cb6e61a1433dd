"""A backend build run from a command, and a model server someone else already serves."""

from __future__ import annotations

import json
import re
import shlex
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

import pytest_haico
from pytest_haico.stack import Orchestrator
from pytest_haico.stack.local import build_llm_service
from pytest_haico.stack.profiles import HttpService
from tests.harness import CONVERSATION_MODULE, CampaignProject

ARMS = {
    "helpful": "[standin]\npersona = 'helpful'\n",
    "looper": "[agent]\nrecursion_limit = 6\n[standin]\npersona = 'looper'\n",
}
VERDICT_TEST = """
def test_conversation(haico_conversation):
    pass  # every verdict is a result here: the test compares them
"""
STANDIN_AS_COMMAND = (
    shlex.join([sys.executable, "-m", "pytest_haico.standins.backend", "--host", "127.0.0.1"])
    + " --port {port}"
)


def _campaign(campaign: CampaignProject) -> None:
    for name, text in ARMS.items():
        campaign.arm(name, text)
    campaign.scripts(
        "a.yaml",
        "- id: plan\n  turns:\n    - user: Plan a trip.\n"
        "- id: write\n  turns:\n    - user: Write it up as a document.\n",
    )
    campaign.write("test_conversations.py", VERDICT_TEST)


def _verdicts(campaign: CampaignProject) -> dict[str, Counter[str]]:
    return {arm: Counter(r["verdict"] for r in campaign.records(arm)) for arm in ARMS}


def test_the_stand_in_backend_run_as_a_command_gives_the_built_in_verdicts(
    campaign: CampaignProject,
) -> None:
    _campaign(campaign)
    built_in = campaign.run_subprocess("--haico-exit", "campaign")
    assert built_in.ret == 0, built_in.stdout.str()
    expected = _verdicts(campaign)
    assert expected["looper"] == {"recursion_limit": 2}

    as_command = campaign.run_subprocess(
        "--haico-exit", "campaign", "--haico-backend-cmd", STANDIN_AS_COMMAND
    )
    assert as_command.ret == 0, as_command.stdout.str()
    # Another build: other item ids, so nothing of the built-in run counts as done.
    as_command.stdout.fnmatch_lines(["haico: 0 done in ledger, 4 to run (0 retries)"])
    as_command.stdout.fnmatch_lines(["*--haico-backend-cmd runs in *not a git checkout*"])
    after = _verdicts(campaign)
    assert {arm: after[arm] - expected[arm] for arm in ARMS} == expected
    identities = Counter(
        json.dumps(r["backend_identity"]) for arm in ARMS for r in campaign.records(arm)
    )
    standin = {
        "kind": "standin",
        "module": "pytest_haico.standins.backend",
        "version": pytest_haico.__version__,
    }
    command = {
        "kind": "cmd",
        "command": STANDIN_AS_COMMAND,
        "git_commit": None,
        "git_dirty": False,
        "git_diff_sha256": None,
    }
    assert identities == {json.dumps(standin): 4, json.dumps(command): 4}

    # The same build again: the same item ids, all done.
    again = campaign.run_subprocess(
        "--haico-exit", "campaign", "--haico-backend-cmd", STANDIN_AS_COMMAND
    )
    assert again.ret == 0
    again.stdout.fnmatch_lines(["haico: 4 done in ledger, 0 to run (0 retries)"])


def test_a_model_server_whose_host_does_not_say_vllm_is_reached_through_the_relay(
    campaign: CampaignProject, served_model: HttpService, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As a model served on another node: the backend sends its key only to a `vllm` host.
    campaign.arm("demo", "[model]\nserved_name = 'shared-model'\n")
    campaign.simple_scripts("s1")
    campaign.write("test_conversations.py", CONVERSATION_MODULE)
    monkeypatch.setenv("HAICO_MODEL_API_KEY", "the-shared-key")
    endpoint = f"http://127.0.0.1:{served_model.port}/v1"
    result = campaign.run_subprocess("--haico-model-endpoint", endpoint)
    assert result.ret == 0, result.stdout.str()
    [record] = campaign.records("demo")
    assert record["verdict"] == "completed"
    assert record["model_identity"]["endpoint"] == endpoint
    result.stdout.re_match_lines([r"haico: demo stack healthy in .* \(ready: model-relay .*"])
    (run,) = (campaign.arm_dir("demo") / "runs").iterdir()
    assert not (run / "logs" / "llm.log").exists()
    assert "127.0.0.1:" in (run / "logs" / "model-relay.log").read_text()
    config = (run / "run-config.env").read_text()
    assert re.search(r"^MODEL_ENDPOINT=http://vllm\.localhost:\d+/v1$", config, re.MULTILINE)
    # Where the relay carries to (a served model's node otherwise in no run-config key).
    assert f"\nMODEL_SERVER_URL={endpoint.removesuffix('/v1')}\n" in config


@pytest.fixture
def served_model(tmp_path: Path) -> Iterator[HttpService]:
    """A stand-in model server started by hand, as another user's job would serve it."""
    llm = build_llm_service(
        served_name="shared-model",
        max_model_len=8192,
        tool_call_parser="hermes",
        persona="helpful",
        latency_ms=0,
        seed=0,
        api_key="the-shared-key",
        name="shared-llm",
    )
    with Orchestrator([llm], tmp_path / "shared-llm-logs", state_dir=tmp_path / "state"):
        yield llm


def test_a_campaign_attaches_to_a_model_server_that_already_runs(
    campaign: CampaignProject, served_model: HttpService, monkeypatch: pytest.MonkeyPatch
) -> None:
    campaign.arm("demo", "[model]\nserved_name = 'shared-model'\n")
    campaign.simple_scripts("s1", "s2")
    campaign.write("test_conversations.py", CONVERSATION_MODULE)
    monkeypatch.setenv("HAICO_MODEL_API_KEY", "the-shared-key")
    endpoint = f"http://vllm.localhost:{served_model.port}/v1"
    result = campaign.run_subprocess("--haico-model-endpoint", endpoint)
    assert result.ret == 0, result.stdout.str()
    records = campaign.records("demo")
    assert [r["verdict"] for r in records] == ["completed", "completed"]
    assert [r["model_identity"] for r in records] == [
        {"kind": "endpoint", "endpoint": endpoint, "served_name": "shared-model"}
    ] * 2
    result.stdout.re_match_lines([r"haico: demo stack healthy in .* \(ready: postgres .*"])
    (run,) = (campaign.arm_dir("demo") / "runs").iterdir()
    assert not (run / "logs" / "llm.log").exists()
    assert not (run / "logs" / "model-relay.log").exists()
    # The key came from the environment; it is in no results file.
    for path in campaign.arm_dir("demo").rglob("*"):
        if path.is_file():
            assert b"the-shared-key" not in path.read_bytes(), path
