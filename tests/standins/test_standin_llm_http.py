"""The stand-in vLLM's HTTP surface: auth, models, refusals, token limits, command line, signals."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from typing import Any

import httpx
import pytest

from pytest_haico.standins.llm import TOOLS_WITHOUT_FLAG
from tests.standins.standin_http import (
    API_KEY,
    MODEL,
    PLACE_ORDER_TOOL,
    TOOLS,
    WRITE_DOCUMENT_TOOL,
    auth,
    chat,
    get,
    message_of,
    post,
    user,
)
from tests.standins.standin_procs import LlmServers, base_env, wait_for_log


def test_health_answers_without_a_key(llm_server: LlmServers) -> None:
    assert get(llm_server().base_url + "/health").status_code == 200


@pytest.mark.parametrize(
    "headers",
    [{}, auth("wrong"), {"Authorization": API_KEY}, {"Authorization": f"Bearer {API_KEY}x"}],
    ids=["none", "wrong", "no-bearer", "longer"],
)
def test_api_refuses_a_missing_or_wrong_key(
    llm_server: LlmServers, headers: dict[str, str]
) -> None:
    base_url = llm_server().base_url
    models = get(f"{base_url}/v1/models", headers=headers)
    body = {"model": MODEL, "messages": user("hi")}
    completion = post(f"{base_url}/v1/chat/completions", json=body, headers=headers)
    for response in (models, completion):
        assert response.status_code == 401
        assert response.json() == {"error": "Unauthorized"}


def test_models_lists_the_served_name_and_max_model_len(llm_server: LlmServers) -> None:
    response = get(llm_server().base_url + "/v1/models", headers=auth())
    assert response.status_code == 200
    (card,) = response.json()["data"]
    assert card["id"] == MODEL
    assert card["max_model_len"] == 8192
    assert card["object"] == "model"


@pytest.mark.parametrize(
    "tool_choice",
    [None, "auto", "none", "required", {"type": "function", "function": {"name": "place_order"}}],
    ids=["absent", "auto", "none", "required", "named"],
)
def test_any_request_with_tools_is_refused_without_the_tool_choice_flag(
    llm_server: LlmServers, tool_choice: object
) -> None:
    fields: dict[str, Any] = {"tools": TOOLS}
    if tool_choice is not None:
        fields["tool_choice"] = tool_choice
    response = chat(llm_server(tools=False).base_url, user("hi"), **fields)
    assert response.status_code == 400
    assert response.json()["error"]["message"] == TOOLS_WITHOUT_FLAG
    assert response.json()["error"]["code"] == 400


def test_without_the_flag_requests_without_tools_are_answered(llm_server: LlmServers) -> None:
    message = message_of(chat(llm_server(tools=False).base_url, user("hi")))
    assert message["content"]


def test_an_unknown_model_is_404(llm_server: LlmServers) -> None:
    response = chat(llm_server().base_url, user("hi"), model="other")
    assert response.status_code == 404
    assert response.json()["error"]["message"] == "The model `other` does not exist."


def test_a_named_tool_missing_from_tools_is_400(llm_server: LlmServers) -> None:
    choice = {"type": "function", "function": {"name": "nope"}}
    tools = [WRITE_DOCUMENT_TOOL]
    response = chat(llm_server().base_url, user("hi"), tools=tools, tool_choice=choice)
    assert response.status_code == 400


def test_a_prompt_beyond_max_model_len_is_400(llm_server: LlmServers) -> None:
    response = chat(llm_server().base_url, user("word " * 8000), max_tokens=10)
    assert response.status_code == 400
    assert "maximum context length is 8192 tokens" in response.json()["error"]["message"]


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_the_token_limit_cuts_the_answer_with_finish_reason_length(
    llm_server: LlmServers, field: str
) -> None:
    limit: dict[str, Any] = {field: 3}
    response = chat(llm_server().base_url, user("tell me about Crete " * 5), **limit)
    assert response.status_code == 200
    choice = response.json()["choices"][0]
    assert choice["finish_reason"] == "length"
    assert response.json()["usage"]["completion_tokens"] <= 3
    assert len(choice["message"]["content"]) <= 12


def test_usage_counts_are_deterministic(llm_server: LlmServers) -> None:
    first = chat(llm_server().base_url, user("hello there"), tools=[PLACE_ORDER_TOOL]).json()
    second = chat(llm_server().base_url, user("hello there"), tools=[PLACE_ORDER_TOOL]).json()
    usage = first["usage"]
    assert usage == second["usage"]
    assert usage["prompt_tokens"] > 0
    assert usage["completion_tokens"] > 0
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def _run_module(*args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "pytest_haico.standins.llm", "--model", "m", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, env=base_env())


def test_an_api_key_in_argv_is_refused() -> None:
    result = _run_module("--api-key", "secret")
    assert result.returncode == 2
    assert "set $VLLM_API_KEY instead" in result.stderr


def test_auto_tool_choice_without_a_parser_is_refused() -> None:
    result = _run_module("--enable-auto-tool-choice")
    assert result.returncode == 2
    assert "--enable-auto-tool-choice requires --tool-call-parser" in result.stderr


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["TERM", "INT"])
def test_a_signal_ends_a_hanging_request_and_exits_0(
    llm_server: LlmServers, sig: signal.Signals
) -> None:
    server = llm_server("hang", stop_signal=sig, replica=1)  # a replica of its own: it stops it
    outcome: list[object] = []

    def request() -> None:
        try:
            outcome.append(chat(server.base_url, user("hi"), timeout=30).status_code)
        except httpx.HTTPError as exc:
            outcome.append(exc)

    thread = threading.Thread(target=request)
    thread.start()
    wait_for_log(server.process.log_path, "holds the request")
    started = time.monotonic()
    assert server.stop() == 0
    assert time.monotonic() - started < 5
    thread.join(10)
    assert outcome, "the hanging request did not end"
