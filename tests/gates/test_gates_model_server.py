"""The model server's dynamic gates against real stand-in vLLM processes: every answering
persona passes (a gate checks capability, not quality); a server without tool flags, with a
short context, another served name, another key or no key fails its gate."""

from __future__ import annotations

import functools
import re
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import httpx
import pytest
import pytest_asyncio

from pytest_haico.config.experiment import Arm
from pytest_haico.gates import dynamic
from pytest_haico.gates.result import AsyncGate, GateResult, arun_gates, render_table
from tests.standins.standin_http import API_KEY, MODEL
from tests.standins.standin_procs import LlmServer, LlmServers

# Every persona but dead, which dies (tested apart): hang answers a conversation's first
# request, and every probe is one.
ANSWERING = ["helpful", "looper", "blank", "bad_args", "flaky", "slow", "hang"]
ARM = Arm.model_validate({"name": "demo", "model": {"served_name": MODEL}})
TOOLS_FIX = (
    "set [vllm] enable_tool_calling = true and tool_call_parser = 'hermes' in arms/demo.toml "
    "(vLLM gets --enable-auto-tool-choice --tool-call-parser hermes); a server started by hand "
    "needs those flags. Never run the arm without them: the backend's agent sends tools with "
    "tool_choice omitted ('auto'), so every turn would fail"
)


def api_base(server: LlmServer) -> str:
    return f"{server.base_url}/v1"


def model_gates(
    client: httpx.AsyncClient, server: LlmServer, *, arm: Arm = ARM, key: str = API_KEY
) -> list[AsyncGate]:
    """The model server's gates in DESIGN's order, as the session runs them."""
    base = api_base(server)
    checks: list[tuple[str, Callable[..., Awaitable[GateResult]], dict[str, Any]]] = [
        (dynamic.SERVED_MODEL, dynamic.check_served_model, {"api_key": key, "arm": arm}),
        (dynamic.MAX_MODEL_LEN, dynamic.check_max_model_len, {"api_key": key, "arm": arm}),
        (dynamic.COMPLETION, dynamic.check_completion, {"api_key": key, "arm": arm}),
        (dynamic.API_KEY, dynamic.check_api_key_required, {}),
        (dynamic.TOOL_CHOICE_AUTO, dynamic.check_tool_choice_auto, {"api_key": key, "arm": arm}),
        (
            dynamic.TOOL_CALL_STRUCTURE,
            dynamic.check_tool_call_structure,
            {"api_key": key, "arm": arm},
        ),
    ]
    return [
        AsyncGate(name, functools.partial(check, client, base, **options))
        for name, check, options in checks
    ]


@pytest_asyncio.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(trust_env=False) as client:
        yield client


@pytest.fixture(scope="module")
def servers(llm_server: LlmServers) -> dict[str, LlmServer]:
    """The stand-ins of this module, started together so that their start-ups overlap."""
    specs: dict[str, tuple[str, dict[str, Any]]] = {persona: (persona, {}) for persona in ANSWERING}
    specs |= {
        "no-tools": ("helpful", {"tools": False}),
        "short-context": ("helpful", {"max_model_len": 1024}),
        "no-key": ("helpful", {"api_key": ""}),
    }
    started = llm_server.prefetch(list(specs.values()))
    return dict(zip(specs, started, strict=True))


@pytest.mark.asyncio
@pytest.mark.parametrize("persona", ANSWERING)
async def test_every_model_gate_passes_for_every_answering_persona(
    client: httpx.AsyncClient, servers: dict[str, LlmServer], persona: str
) -> None:
    gates = model_gates(client, servers[persona])
    results = await arun_gates(gates)
    assert [r.name for r in results if r.passed] == [g.name for g in gates], render_table(results)


@pytest.mark.asyncio
async def test_a_server_without_tool_flags_fails_the_tool_capability_probe(
    client: httpx.AsyncClient, servers: dict[str, LlmServer]
) -> None:
    results = await arun_gates(model_gates(client, servers["no-tools"]))
    assert [(r.name, r.passed) for r in results][-2:] == [
        (dynamic.API_KEY, True),
        (dynamic.TOOL_CHOICE_AUTO, False),
    ]
    assert results[-1].failure_line == (
        "gate tool_choice_auto failed: the model server refuses tool calls as the backend "
        'sends them: HTTP 400: "auto" tool choice requires --enable-auto-tool-choice and '
        f"--tool-call-parser to be set; {TOOLS_FIX}"
    )


@pytest.mark.asyncio
async def test_a_context_shorter_than_the_arms_fails(
    client: httpx.AsyncClient, servers: dict[str, LlmServer]
) -> None:
    result = await dynamic.check_max_model_len(
        client, api_base(servers["short-context"]), api_key=API_KEY, arm=ARM
    )
    assert result.failure_line == (
        "gate max_model_len failed: the server's max_model_len is 1024, below the arm's 8192: "
        "long conversations would be refused; start vLLM with --max-model-len 8192 ([vllm] "
        "max_model_len in arms/demo.toml is passed to it; if the GPUs cannot hold that "
        "context, lower max_model_len in the arm — a different experiment — or raise "
        "--gpu-memory-utilization in [vllm] extra_args)"
    )


@pytest.mark.asyncio
async def test_another_served_name_fails(
    client: httpx.AsyncClient, servers: dict[str, LlmServer]
) -> None:
    arm = Arm.model_validate({"name": "qwen32b", "model": {"served_name": "qwen32b"}})
    result = await dynamic.check_served_model(
        client, api_base(servers["helpful"]), api_key=API_KEY, arm=arm
    )
    assert result.failure_line == (
        f"gate served_model failed: the server serves ['{MODEL}'], not 'qwen32b' (arm qwen32b); "
        "set [model] served_name in arms/qwen32b.toml to the name the server serves, or start "
        "the server with --served-model-name qwen32b"
    )


@pytest.mark.asyncio
async def test_another_key_fails_the_first_gate(
    client: httpx.AsyncClient, servers: dict[str, LlmServer]
) -> None:
    server = servers["helpful"]
    results = await arun_gates(model_gates(client, server, key="not-the-servers-key"))
    (result,) = results
    assert result.failure_line == (
        f"gate served_model failed: GET {api_base(server)}/models with the run's key: HTTP 401: "
        "Unauthorized (the server has another key); the model server must run with the key "
        "this run gives it (VLLM_API_KEY in its environment); a server started by hand "
        "(--haico-model-endpoint) needs the same VLLM_API_KEY as this run"
    )
    completion = await dynamic.check_completion(
        client, api_base(server), api_key="wrong", arm=ARM, attempts=1
    )
    assert completion.detail == "a one-token completion: HTTP 401: Unauthorized"


@pytest.mark.asyncio
async def test_a_run_without_a_key_fails_the_first_gate_naming_the_variable(
    client: httpx.AsyncClient, servers: dict[str, LlmServer]
) -> None:
    server = servers["helpful"]
    (result,) = await arun_gates(model_gates(client, server, key=""))
    assert result.failure_line == (
        f"gate served_model failed: GET {api_base(server)}/models without a key: HTTP 401: "
        "Unauthorized (the server wants one; the run has none); set HAICO_MODEL_API_KEY to "
        "the key the model server was started with (its VLLM_API_KEY)"
    )


@pytest.mark.asyncio
async def test_a_server_without_a_key_fails_the_key_gate(
    client: httpx.AsyncClient, servers: dict[str, LlmServer]
) -> None:
    result = await dynamic.check_api_key_required(client, api_base(servers["no-key"]))
    assert result.failure_line.startswith(
        "gate api_key failed: the model server answers without a key: the run's VLLM_API_KEY "
        "never reached it, and every user of the node can use it; "
    )


@pytest.fixture
def silent_server() -> Iterator[str]:
    """An OpenAI base URL whose server takes the connection and never answers (a wedged
    engine: the kernel completes the handshake of a socket that nobody reads)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/v1"


@pytest.mark.asyncio
async def test_a_model_that_never_answers_fails_the_completion_at_its_timeout(
    client: httpx.AsyncClient, silent_server: str
) -> None:
    base = silent_server
    result = await dynamic.check_completion(client, base, api_key=API_KEY, arm=ARM, timeout_s=1)
    assert not result.passed
    assert result.detail == (
        f"a one-token completion: POST {base}/chat/completions: no answer within 1 s"
    )
    assert result.fix == (
        "check the model server's log (runs/<run_id>/logs/): it may have died or be loading "
        "still; a GPU fault keeps /health at 200 — resubmit to get another node"
    )


@pytest.mark.asyncio
async def test_a_dead_engine_fails_the_completion(
    client: httpx.AsyncClient, llm_server: LlmServers
) -> None:
    server = llm_server("dead", replica=101)  # this test kills it
    base = api_base(server)
    assert (await dynamic.check_served_model(client, base, api_key=API_KEY, arm=ARM)).passed
    result = await dynamic.check_completion(client, base, api_key=API_KEY, arm=ARM)
    assert not result.passed
    assert result.detail.startswith(f"a one-token completion: POST {base}/chat/completions: ")
    # 500 with an empty body while the engine dies, then nothing listens: final.
    assert re.search(
        r"ConnectError: .* \(after \d+ retr(y|ies): HTTP 500(, HTTP 500)*\)$", result.detail
    ), result.detail


@pytest.mark.asyncio
@pytest.mark.parametrize("version", ["0.10.0", "0.13.0", "0.14.1"])
async def test_the_tool_flags_are_found_in_every_error_body_shape(
    client: httpx.AsyncClient, llm_server: LlmServers, version: str
) -> None:
    server = llm_server("helpful", tools=False, vllm_version=version)
    base = api_base(server)
    auto = await dynamic.check_tool_choice_auto(client, base, api_key=API_KEY, arm=ARM)
    assert (auto.passed, auto.fix) == (False, TOOLS_FIX)
    named = await dynamic.check_tool_call_structure(client, base, api_key=API_KEY, arm=ARM)
    if version == "0.14.1":
        # From 0.14 a named choice needs the parser too; the same fix.
        assert (named.passed, named.fix) == (False, TOOLS_FIX)
    else:
        # Up to 0.13 a named probe passes on a server the backend cannot use: why the
        # tool-capability probe sends tool_choice omitted.
        assert named.passed, named
