"""The wire contract: what the harness and the backend read of vLLM, held on the stand-in and on
real vLLM 0.32 alike, through raw HTTP, the official ``openai`` client and ChatOpenAI.

Where the two servers may not answer alike, the difference is in ``differences.py`` with its
reason, and asserted there as the difference it is.
"""

from __future__ import annotations

import json
from typing import Any, cast

import openai
import pytest
from langchain_core.messages import AIMessage, AIMessageChunk

from pytest_haico.provenance.model_server import parse_metrics
from pytest_haico.standins.refusals import TOOLS_WITHOUT_FLAG
from tests.polling import wait_for
from tests.vllm.servers import ServerPair, iter_samples

HELLO = [{"role": "user", "content": "Say hello."}]
WEATHER = [{"role": "user", "content": "What is the weather in Paris?"}]
# strict: vLLM 0.32 pins a forced call's arguments to the schema only for strict tools.
WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the weather of a city.",
        "strict": True,
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 20}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
NAMED = {"type": "function", "function": {"name": "get_weather"}}
# Enough for a forced call of WEATHER_TOOL to finish (its first request compiles a grammar).
CALL_TOKENS = 256
CARD_FIELDS = {
    "id",
    "object",
    "created",
    "owned_by",
    "root",
    "parent",
    "max_model_len",
    "permission",
}
# What the harness's run-config reads of /metrics, each labelled by engine and model name.
READ_METRICS = (
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
)


def words(count: int) -> list[dict[str, Any]]:
    return [{"role": "user", "content": "word " * count}]


def error_of(response: Any, status: int) -> dict[str, Any]:
    """The nested error object of a refusal, asserting its status and shape."""
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["code"] == status
    error: dict[str, Any] = body["error"]
    return error


# --- the endpoints without a key ---------------------------------------------------------


def test_health_answers_anyone_with_200_and_no_body(servers: ServerPair) -> None:
    response = servers.tools.get("/health", key="")
    assert (response.status_code, response.content) == (200, b"")


@pytest.mark.parametrize("key", ["", "wrong-key"], ids=["no-key", "wrong-key"])
def test_metrics_answer_without_the_key_as_vllm_guards_only_v1(
    servers: ServerPair, key: str
) -> None:
    # docs/cluster.md says why the stand-in does not put /metrics behind the key: vLLM does not.
    response = servers.tools.get("/metrics", key=key)
    assert response.status_code == 200
    assert "vllm:num_requests_running" in response.text


def test_version_is_the_release(servers: ServerPair) -> None:
    # The stand-in adds that it is one (listed in test_wire_differences).
    assert servers.tools.get("/version", key="").json()["version"] == "0.32.0"


def test_the_model_card_carries_what_the_gates_read(servers: ServerPair) -> None:
    server = servers.tools
    (card,) = server.openai().models.list().data
    assert (card.id, card.owned_by, card.object) == (server.model, "vllm", "model")
    raw = server.get("/v1/models").json()
    assert raw["object"] == "list"
    (fields,) = raw["data"]
    assert set(fields) == CARD_FIELDS
    assert (fields["root"], fields["max_model_len"]) == (server.root, server.max_model_len)
    assert fields["permission"][0]["object"] == "model_permission"


@pytest.mark.parametrize("key", ["", "wrong-key"], ids=["no-key", "wrong-key"])
def test_v1_without_the_key_is_401_unauthorized_as_a_string(servers: ServerPair, key: str) -> None:
    server = servers.tools
    for response in (server.get("/v1/models", key=key), server.chat(HELLO, key=key, max_tokens=1)):
        assert (response.status_code, response.json()) == (401, {"error": "Unauthorized"})
    with pytest.raises(openai.AuthenticationError) as refused:
        server.openai(key=key or "none").models.list()
    assert refused.value.status_code == 401


# --- streamed chat ------------------------------------------------------------------------


def test_a_stream_is_role_then_content_deltas_then_finish_then_usage(servers: ServerPair) -> None:
    server = servers.tools
    chunks = list(
        server.openai().chat.completions.create(
            model=server.model,
            messages=cast(Any, HELLO),
            max_tokens=12,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    *with_choices, last = chunks
    assert {c.id for c in chunks} == {chunks[0].id}
    assert {(c.object, c.model) for c in chunks} == {("chat.completion.chunk", server.model)}
    first = with_choices[0].choices[0]
    assert (first.delta.role, first.delta.content, first.finish_reason) == ("assistant", "", None)
    middle = [c.choices[0] for c in with_choices[1:]]
    assert len(middle) >= 2
    assert all(c.delta.role is None and isinstance(c.delta.content, str) for c in middle[:-1])
    assert [c.finish_reason for c in middle[:-1]] == [None] * (len(middle) - 1)
    assert middle[-1].finish_reason in ("stop", "length")
    assert last.choices == [] and last.usage is not None
    usage = last.usage
    assert 1 <= usage.completion_tokens <= 12
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


def test_stream_chunks_carry_no_usage_until_the_last(servers: ServerPair) -> None:
    chunks = servers.tools.stream(
        HELLO, max_tokens=4, temperature=0, stream_options={"include_usage": True}
    )
    assert all("usage" not in c for c in chunks[:-1])
    assert set(chunks[-1]["usage"]) >= {"prompt_tokens", "completion_tokens", "total_tokens"}


def test_a_length_finish_rides_on_the_last_generated_piece(servers: ServerPair) -> None:
    chunks = servers.tools.stream(HELLO, max_tokens=4, temperature=0)
    final = chunks[-1]["choices"][0]
    assert final["finish_reason"] == "length"
    assert final["delta"]["content"], final


def test_the_streamed_text_and_usage_equal_the_whole_answer(servers: ServerPair) -> None:
    server = servers.tools
    fields: dict[str, Any] = {"max_tokens": 12, "temperature": 0}
    chunks = server.stream(HELLO, stream_options={"include_usage": True}, **fields)
    whole = server.chat(HELLO, **fields).json()
    streamed = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks[:-1])
    assert streamed == whole["choices"][0]["message"]["content"]
    assert chunks[-2]["choices"][0]["finish_reason"] == whole["choices"][0]["finish_reason"]
    usage = {k: whole["usage"][k] for k in ("prompt_tokens", "completion_tokens", "total_tokens")}
    assert chunks[-1]["usage"] == usage


# --- tool calls ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tool_choice", "finish_reason"), [(NAMED, "stop"), ("required", "tool_calls")]
)
def test_a_forced_call_streams_a_header_then_argument_deltas_with_index(
    servers: ServerPair, tool_choice: Any, finish_reason: str
) -> None:
    chunks = servers.tools.stream(
        WEATHER,
        tools=[WEATHER_TOOL],
        tool_choice=tool_choice,
        max_tokens=CALL_TOKENS,
        temperature=0,
    )
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    calls = [d for d in deltas if "tool_calls" in d]
    assert all(d["content"] is None and len(d["tool_calls"]) == 1 for d in calls)
    header, *fragments = (d["tool_calls"][0] for d in calls)
    assert set(header) == {"index", "id", "type", "function"}
    assert (header["index"], header["type"]) == (0, "function")
    assert header["id"].startswith("chatcmpl-tool-")
    assert header["function"] == {"name": "get_weather"}
    assert fragments and all(set(f) == {"index", "function"} and f["index"] == 0 for f in fragments)
    arguments = json.loads("".join(f["function"]["arguments"] for f in fragments))
    assert set(arguments) == {"city"} and 0 < len(arguments["city"]) <= 20
    assert chunks[-1]["choices"][0]["finish_reason"] == finish_reason


def test_chat_openai_gets_a_named_call_as_a_tool_call(servers: ServerPair) -> None:
    model = servers.tools.chat_openai(max_tokens=CALL_TOKENS, temperature=0)
    bound = model.bind_tools([WEATHER_TOOL], tool_choice="get_weather", strict=True)
    message = bound.invoke("What is the weather in Paris?")
    assert isinstance(message, AIMessage)
    (call,) = message.tool_calls
    assert call["name"] == "get_weather" and isinstance(call["args"]["city"], str)
    assert call["id"] and call["id"].startswith("chatcmpl-tool-")


def test_tools_on_a_server_without_the_flags_are_refused_unless_none(servers: ServerPair) -> None:
    server = servers.plain
    refused = {
        "omitted": TOOLS_WITHOUT_FLAG,
        "auto": TOOLS_WITHOUT_FLAG,
        "required": 'tool_choice="required" requires --tool-call-parser to be set',
        "named": 'tool_choice=function "get_weather" requires --tool-call-parser to be set',
    }
    choices: dict[str, Any] = {"omitted": None, "auto": "auto", "required": "required"}
    for case, message in refused.items():
        fields = {"tool_choice": choices.get(case, NAMED)} if case != "omitted" else {}
        response = server.chat(WEATHER, tools=[WEATHER_TOOL], max_tokens=4, **fields)
        error = error_of(response, 400)
        assert (error["message"], error["type"], error["param"]) == (
            message,
            "BadRequestError",
            None,
        ), case
    served = server.chat(WEATHER, tools=[WEATHER_TOOL], tool_choice="none", max_tokens=4)
    assert served.status_code == 200, served.text


def test_chat_openai_with_tools_as_the_backend_binds_them_gets_the_400(
    servers: ServerPair,
) -> None:
    # The backend's ReAct agent binds tools and omits tool_choice.
    bound = servers.plain.chat_openai(max_tokens=4).bind_tools([WEATHER_TOOL])
    with pytest.raises(openai.BadRequestError) as refused:
        bound.invoke("What is the weather in Paris?")
    assert refused.value.status_code == 400
    assert TOOLS_WITHOUT_FLAG in str(refused.value)


# --- refusals -----------------------------------------------------------------------------


def test_a_prompt_longer_than_the_context_is_refused_at_least_one_over(
    servers: ServerPair,
) -> None:
    server = servers.tools
    limit = server.max_model_len
    error = error_of(server.chat(words(3000), max_tokens=4), 400)
    assert error["param"] == "input_tokens"
    assert error["message"] == (
        f"This model's maximum context length is {limit} tokens. However, your prompt contains "
        f"at least {limit + 1} input tokens, which exceeds this limit even without any output "
        f"tokens. Please reduce the length of the input prompt. "
        f"(parameter=input_tokens, value={limit + 1})"
    )


def test_max_tokens_over_the_context_is_refused(servers: ServerPair) -> None:
    server = servers.tools
    limit, asked = server.max_model_len, server.max_model_len + 1
    error = error_of(server.chat(HELLO, max_tokens=asked), 400)
    assert (error["param"], error["type"]) == ("max_tokens", "BadRequestError")
    assert error["message"] == (
        f"max_tokens={asked} cannot be greater than max_model_len={limit}. Please request "
        f"fewer output tokens. (parameter=max_tokens, value={asked})"
    )
    with pytest.raises(openai.BadRequestError):
        server.openai().chat.completions.create(
            model=server.model,
            messages=cast(Any, HELLO),
            max_tokens=asked,
        )


def test_a_prompt_and_budget_over_the_context_get_the_room_left(servers: ServerPair) -> None:
    server = servers.tools
    # Each server counts tokens its own way: measure its count of a word, then leave ~16.
    small, large = (server.chat(words(n), max_tokens=1).json()["usage"] for n in (100, 300))
    per_word = (large["prompt_tokens"] - small["prompt_tokens"]) / 200
    count = int(100 + (server.max_model_len - 16 - small["prompt_tokens"]) / per_word)
    answer = server.chat(words(count), max_tokens=64, temperature=0)
    assert answer.status_code == 200, answer.text
    usage = answer.json()["usage"]
    assert server.max_model_len - 32 < usage["prompt_tokens"] < server.max_model_len
    assert usage["completion_tokens"] <= server.max_model_len - usage["prompt_tokens"]


def test_an_unknown_model_is_404_naming_the_served_ones(servers: ServerPair) -> None:
    server = servers.tools
    error = error_of(server.chat(HELLO, model="no-such-model", max_tokens=1), 404)
    assert (error["type"], error["param"]) == ("NotFoundError", "model")
    assert error["message"] == (
        f"The model `no-such-model` does not exist. Valid aliases: {server.model}."
    )


# --- metrics ------------------------------------------------------------------------------


def test_metrics_have_the_names_and_labels_the_run_config_reads(servers: ServerPair) -> None:
    server = servers.tools
    response = server.get("/metrics", key="")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    samples = list(iter_samples(response.text))
    for name in READ_METRICS:
        labels = [labels for found, labels in samples if found == name]
        assert labels == [{"engine": "0", "model_name": server.model}], name
    assert set(parse_metrics(response.text.splitlines())) >= set(READ_METRICS)
    assert "vllm:gpu_cache_usage_perc" not in {name for name, _ in samples}


def test_metrics_count_the_tokens_of_a_completion(servers: ServerPair) -> None:
    server = servers.tools

    def read() -> dict[str, float]:
        return parse_metrics(server.get("/metrics", key="").text.splitlines())

    before = read()
    usage = server.chat(words(40), max_tokens=8, temperature=0).json()["usage"]
    wanted = {
        "vllm:prompt_tokens_total": before["vllm:prompt_tokens_total"] + usage["prompt_tokens"],
        "vllm:generation_tokens_total": before["vllm:generation_tokens_total"]
        + usage["completion_tokens"],
        "vllm:num_requests_running": 0.0,
    }
    wait_for(
        lambda: {k: read()[k] for k in wanted} == wanted,
        timeout=15,
        what=f"/metrics to count {usage}",
    )


# --- ChatOpenAI, text ---------------------------------------------------------------------


def test_chat_openai_reads_text_and_usage_invoked_and_streamed(servers: ServerPair) -> None:
    model = servers.tools.chat_openai(max_tokens=12, temperature=0, stream_usage=True)
    whole = model.invoke("Say hello.")
    assert isinstance(whole, AIMessage) and isinstance(whole.content, str) and whole.content
    assert whole.response_metadata["finish_reason"] in ("stop", "length")
    assert whole.response_metadata["model_name"] == servers.tools.model
    streamed: AIMessageChunk | None = None
    for chunk in model.stream("Say hello."):
        assert isinstance(chunk, AIMessageChunk)
        streamed = chunk if streamed is None else streamed + chunk
    assert streamed is not None and streamed.content == whole.content
    assert whole.usage_metadata is not None and streamed.usage_metadata is not None
    for count in ("input_tokens", "output_tokens", "total_tokens"):
        assert streamed.usage_metadata[count] == whole.usage_metadata[count], count
