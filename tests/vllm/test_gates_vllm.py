"""The dynamic gates against real vLLM 0.32: a cluster-profile run pointed at a running vLLM
(`--haico-model-endpoint`, its key in $HAICO_MODEL_API_KEY) stops at the gate that names what
is wrong, exit 78, before its first item: a server started without the tool flags, probed as
the backend calls (test_cluster_vllm's campaign passes every gate with them), another served
name, a context shorter than the arm's, no key, another key. The two vLLMs are the session's."""

from __future__ import annotations

from typing import Any

import pytest

from tests.integration.test_gates_in_a_run import DYNAMIC, STATIC, literal
from tests.vllm.servers import Server, ServerPair
from tests.vllm.vllm_campaign import VllmCampaign

pytestmark = pytest.mark.vllm

# name -> (the server: with the tool flags or without, arm changes, the run's key: the
# server's, another or none; the gate that fails, its failure line, `*` for what varies).
CASES: dict[str, tuple[str, dict[str, Any], str, str, str]] = {
    "no-tool-flags": (
        "plain",
        {},
        "server",
        "tool_choice_auto",
        "gate tool_choice_auto failed: the model server refuses tool calls as the backend "
        "sends them: HTTP 400: *--tool-call-parser*; set [vllm] enable_tool_calling = true and "
        "tool_call_parser = 'hermes' in arms/smol.toml*",
    ),
    "another-served-name": (
        "tools",
        {"served_name": "qwen32b"},
        "server",
        "served_model",
        "gate served_model failed: the server serves ['smollm2-135m'], not 'qwen32b' (arm "
        "smol); set [model] served_name in arms/smol.toml*",
    ),
    "short-context": (
        "tools",
        {"max_model_len": 4096},
        "server",
        "max_model_len",
        "gate max_model_len failed: the server's max_model_len is 2048, below the arm's 4096: "
        "long conversations would be refused; start vLLM with --max-model-len 4096*",
    ),
    "no-key": (
        "tools",
        {},
        "none",
        "served_model",
        "gate served_model failed: GET http://127.0.0.1:*/v1/models without a key: HTTP "
        "401: Unauthorized (the server wants one; the run has none); set HAICO_MODEL_API_KEY*",
    ),
    "another-key": (
        "tools",
        {},
        "another",
        "served_model",
        "gate served_model failed: GET http://127.0.0.1:*/v1/models with the run's key: "
        "HTTP 401: Unauthorized (the server has another key)*",
    ),
}


def _endpoint(server: Server) -> str:
    """The server's OpenAI base under a name the backend sends VLLM_API_KEY to."""
    return server.api_base.replace("127.0.0.1", "vllm.localhost")


@pytest.mark.parametrize("case", CASES)
def test_a_real_vllm_that_cannot_serve_the_arm_stops_the_run_at_its_gate(
    tier_campaign: VllmCampaign,
    real_vllm: ServerPair,
    monkeypatch: pytest.MonkeyPatch,
    case: str,
) -> None:
    which, arm, key, gate, line = CASES[case]
    server = real_vllm.tools if which == "tools" else real_vllm.plain
    tier_campaign.arm(concurrency=1, **arm)
    tier_campaign.scripts(1, turns=1)
    keys = {"server": server.api_key, "another": "not-the-key-of-this-vllm"}
    if key in keys:
        monkeypatch.setenv("HAICO_MODEL_API_KEY", keys[key])
    else:
        monkeypatch.delenv("HAICO_MODEL_API_KEY", raising=False)

    result = tier_campaign.run("--haico-model-endpoint", _endpoint(server), timeout=600)

    assert result.ret == 78, result.stdout.str()
    result.stdout.fnmatch_lines([literal(f"gate failed (exit 78): arm smol: {line}")])
    gates = tier_campaign.gates()
    assert (gates["passed"], gates["failed_gate"]) == (False, gate)
    names = STATIC + DYNAMIC
    assert [g["name"] for g in gates["gates"]] == names[: names.index(gate) + 1]
    assert tier_campaign.records() == []
