"""The stand-in vLLM's HTTP surface: auth, models, refusals, token limits, command line, signals."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from typing import Any

import httpx
import pytest
from pydantic import BaseModel, ValidationError

from pytest_haico.standins.agent import WriteDocumentArgs
from pytest_haico.standins.refusals import TOOLS_WITHOUT_FLAG
from tests.standins.standin_http import (
    API_KEY,
    MODEL,
    PLACE_ORDER_TOOL,
    TOOLS,
    WRITE_DOCUMENT_TOOL,
    PlaceOrder,
    auth,
    chat,
    continued,
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


NAMED = {"type": "function", "function": {"name": "place_order"}}


@pytest.mark.parametrize("vllm_version", [None, "0.14.1"], ids=["default", "0.14"])
@pytest.mark.parametrize("tool_choice", [None, "auto"], ids=["absent", "auto"])
def test_without_the_flags_auto_tool_choice_is_refused(
    llm_server: LlmServers, tool_choice: str | None, vllm_version: str | None
) -> None:
    fields: dict[str, Any] = {"tools": TOOLS}
    if tool_choice is not None:
        fields["tool_choice"] = tool_choice
    server = llm_server(tools=False, vllm_version=vllm_version)
    response = chat(server.base_url, user("hi"), **fields)
    assert response.status_code == 400
    assert response.json() == {
        "error": {
            "message": TOOLS_WITHOUT_FLAG,
            "type": "BadRequestError",
            "param": None,
            "code": 400,
        }
    }


@pytest.mark.parametrize(
    ("tool_choice", "name", "schema"),
    [("required", "write_document", WriteDocumentArgs), (NAMED, "place_order", PlaceOrder)],
    ids=["required", "named"],
)
def test_without_the_flags_up_to_0_13_a_forced_tool_choice_is_guided(
    llm_server: LlmServers, tool_choice: object, name: str, schema: type[BaseModel]
) -> None:
    base_url = llm_server(tools=False).base_url
    response = chat(base_url, user("hi"), tools=TOOLS, tool_choice=tool_choice)
    assert response.status_code == 200, response.text
    (choice,) = response.json()["choices"]
    # vLLM's non-streamed guided answer: content "", finish_reason "stop", never "tool_calls".
    assert choice["finish_reason"] == "stop"
    assert choice["message"]["content"] == ""
    (call,) = choice["message"]["tool_calls"]
    assert call["function"]["name"] == name
    schema.model_validate_json(call["function"]["arguments"])


@pytest.mark.parametrize(
    ("tool_choice", "message"),
    [
        ("required", 'tool_choice="required" requires --tool-call-parser to be set'),
        (
            NAMED,
            "tool_choice=\"function=ChatCompletionNamedFunction(name='place_order') "
            "type='function'\" requires --tool-call-parser to be set",
        ),
    ],
    ids=["required", "named"],
)
def test_without_the_flags_from_0_14_a_forced_tool_choice_is_refused(
    llm_server: LlmServers, tool_choice: object, message: str
) -> None:
    server = llm_server(tools=False, vllm_version="0.14.1")
    response = chat(server.base_url, user("hi"), tools=TOOLS, tool_choice=tool_choice)
    assert response.status_code == 400
    assert response.json()["error"]["message"] == message


@pytest.mark.parametrize("vllm_version", [None, "0.14.1"], ids=["default", "0.14"])
def test_without_the_flags_tool_choice_none_is_answered(
    llm_server: LlmServers, vllm_version: str | None
) -> None:
    server = llm_server(tools=False, vllm_version=vllm_version)
    message = message_of(chat(server.base_url, user("hi"), tools=TOOLS, tool_choice="none"))
    assert message["content"]
    assert not message.get("tool_calls")


@pytest.mark.parametrize("vllm_version", [None, "0.14.1"], ids=["default", "0.14"])
def test_with_the_flags_every_tool_choice_is_answered(
    llm_server: LlmServers, vllm_version: str | None
) -> None:
    base_url = llm_server(vllm_version=vllm_version).base_url
    for tool_choice in (None, "auto", "none", "required", NAMED):
        fields: dict[str, Any] = {"tools": TOOLS}
        if tool_choice is not None:
            fields["tool_choice"] = tool_choice
        assert chat(base_url, user("hi"), **fields).status_code == 200, tool_choice


def test_up_to_0_10_0_error_bodies_are_flat(llm_server: LlmServers) -> None:
    base_url = llm_server(tools=False, vllm_version="0.10.0").base_url
    response = chat(base_url, user("hi"), tools=TOOLS)
    assert response.status_code == 400
    assert response.json() == {
        "object": "error",
        "message": TOOLS_WITHOUT_FLAG,
        "type": "BadRequestError",
        "param": None,
        "code": 400,
    }
    unknown = chat(base_url, user("hi"), model="other")
    assert unknown.json()["message"] == "The model `other` does not exist."
    assert unknown.json()["code"] == 404


@pytest.mark.parametrize("vllm_version", ["0.10.0", "0.13.0"])
def test_a_missing_key_is_401_with_a_string_error_in_every_version(
    llm_server: LlmServers, vllm_version: str
) -> None:
    response = get(llm_server(vllm_version=vllm_version).base_url + "/v1/models")
    assert response.status_code == 401
    assert response.json() == {"error": "Unauthorized"}


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
    assert "does not match any of the specified `tools`" in response.json()["error"]["message"]


@pytest.mark.parametrize(
    "tool_choice", ["auto", "required", NAMED], ids=["auto", "required", "named"]
)
def test_a_tool_choice_without_tools_is_400(llm_server: LlmServers, tool_choice: object) -> None:
    response = chat(llm_server().base_url, user("hi"), tool_choice=tool_choice)
    assert response.status_code == 400
    expected = "When using `tool_choice`, `tools` must be set."
    assert response.json()["error"]["message"] == expected


def test_max_tokens_cuts_a_guided_call_with_finish_reason_length(llm_server: LlmServers) -> None:
    base_url = llm_server().base_url
    whole = chat(base_url, user("hi"), tools=TOOLS, tool_choice=NAMED).json()
    cut = chat(base_url, user("hi"), tools=TOOLS, tool_choice=NAMED, max_tokens=4).json()
    (choice,) = cut["choices"]
    assert choice["finish_reason"] == "length"
    arguments = choice["message"]["tool_calls"][0]["function"]["arguments"]
    full = whole["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]
    assert full.startswith(arguments)
    assert len(arguments) < len(full)
    assert cut["usage"]["completion_tokens"] <= 4
    with pytest.raises(ValidationError):
        PlaceOrder.model_validate_json(arguments)


@pytest.mark.parametrize("path", ["/health", "/version", "/metrics"])
def test_only_the_api_needs_the_key(llm_server: LlmServers, path: str) -> None:
    assert get(llm_server().base_url + path).status_code == 200


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


@pytest.mark.subprocess
def test_an_api_key_in_argv_is_refused() -> None:
    result = _run_module("--api-key", "secret")
    assert result.returncode == 2
    assert "set $VLLM_API_KEY instead" in result.stderr


@pytest.mark.subprocess
def test_a_bad_vllm_version_is_refused() -> None:
    result = _run_module("--vllm-version", "latest")
    assert result.returncode == 2
    assert "'latest' is not a vLLM release number (e.g. 0.13.0" in result.stderr


@pytest.mark.subprocess
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
            outcome.append(chat(server.base_url, continued("hi"), timeout=30).status_code)
        except httpx.HTTPError as exc:
            outcome.append(exc)

    thread = threading.Thread(target=request)
    thread.start()
    wait_for_log(server.process.log_path, "holds the request")
    # 0: it ended itself; one still running after stop()'s grace is SIGKILLed (-9).
    assert server.stop() == 0
    thread.join(10)
    assert outcome, "the hanging request did not end"
