"""The stand-in vLLM's streaming format, as the OpenAI SDK and ChatOpenAI read it."""

from __future__ import annotations

import json
from typing import Any, cast

import httpx
import openai
from langchain_core.messages import AIMessage
from langchain_openai import ChatOpenAI
from pydantic import SecretStr

from pytest_haico.standins.agent import WriteDocumentArgs, write_document
from tests.standins.standin_http import API_KEY, MODEL, TOOLS, chat, message_of, sse_data, user
from tests.standins.standin_procs import LlmServers

ARTIFACT_TURN = user("Please write a document about Crete in May.")


def stream_chunks(base_url: str, messages: list[dict[str, Any]], **fields: Any) -> list[Any]:
    """The decoded chunks of a streamed completion, asserting the ``data: [DONE]`` ending."""
    response = chat(base_url, messages, stream=True, **fields)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/event-stream")
    payloads = sse_data(response.text)
    assert payloads[-1] == "[DONE]"
    assert "[DONE]" not in payloads[:-1]
    return [json.loads(p) for p in payloads[:-1]]


def test_a_text_stream_starts_with_the_role_and_ends_with_stop(llm_server: LlmServers) -> None:
    chunks = stream_chunks(llm_server().base_url, user("hello"))
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert len({c["id"] for c in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert [c["choices"][0]["finish_reason"] for c in chunks][-1] == "stop"
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])
    assert all("usage" not in c for c in chunks)


def test_the_streamed_text_equals_the_whole_answer(llm_server: LlmServers) -> None:
    base_url = llm_server().base_url
    chunks = stream_chunks(base_url, user("hello"))
    streamed = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert len(chunks) > 3, "the text should arrive in pieces"
    assert streamed == message_of(chat(base_url, user("hello")))["content"]


def test_a_tool_call_streams_as_header_fragments_and_finish(llm_server: LlmServers) -> None:
    base_url = llm_server().base_url
    chunks = stream_chunks(base_url, ARTIFACT_TURN, tools=TOOLS)
    deltas = [c["choices"][0]["delta"] for c in chunks]
    calls = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
    header, fragments = calls[0], calls[1:]
    assert header["index"] == 0
    assert header["id"].startswith("chatcmpl-tool-")
    assert header["type"] == "function"
    assert header["function"] == {"name": "write_document", "arguments": ""}
    assert len(fragments) >= 2
    assert all(set(f) == {"index", "function"} and f["index"] == 0 for f in fragments)
    arguments = "".join(f["function"]["arguments"] for f in fragments)
    WriteDocumentArgs.model_validate_json(arguments)
    final = chunks[-1]["choices"][0]
    assert final == {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "tool_calls"}
    whole = message_of(chat(base_url, ARTIFACT_TURN, tools=TOOLS))
    assert whole["tool_calls"][0]["function"]["arguments"] == arguments
    assert whole["tool_calls"][0]["id"] == header["id"]


def test_a_guided_call_streams_like_a_parsed_one_and_ends_with_tool_calls(
    llm_server: LlmServers,
) -> None:
    base_url = llm_server().base_url
    named = {"type": "function", "function": {"name": "write_document"}}
    chunks = stream_chunks(base_url, user("hello"), tools=TOOLS, tool_choice=named)
    deltas = [c["choices"][0]["delta"] for c in chunks]
    calls = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
    assert calls[0]["function"] == {"name": "write_document", "arguments": ""}
    arguments = "".join(c["function"]["arguments"] for c in calls)
    # Unlike the non-streamed answer ("stop"): vLLM marks a stream that sent a call.
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    whole = chat(base_url, user("hello"), tools=TOOLS, tool_choice=named).json()
    assert whole["choices"][0]["finish_reason"] == "stop"
    assert whole["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] == arguments
    WriteDocumentArgs.model_validate_json(arguments)


def test_include_usage_ends_the_stream_with_a_usage_chunk(llm_server: LlmServers) -> None:
    base_url = llm_server().base_url
    options = {"stream_options": {"include_usage": True}}
    chunks = stream_chunks(base_url, ARTIFACT_TURN, tools=TOOLS, **options)
    assert all(c["usage"] is None for c in chunks[:-1])
    assert chunks[-1]["choices"] == []
    whole = chat(base_url, ARTIFACT_TURN, tools=TOOLS).json()
    assert chunks[-1]["usage"] == whole["usage"]


def test_the_openai_sdk_reassembles_a_streamed_tool_call(llm_server: LlmServers) -> None:
    client = openai.OpenAI(
        base_url=llm_server().base_url + "/v1",
        api_key=API_KEY,
        # openai 3 types its clients as httpx2 and accepts httpx ones, as the backend's.
        http_client=cast(Any, httpx.Client(trust_env=False)),
    )
    with client:
        stream = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "write a report"}],
            tools=cast(Any, TOOLS),
            stream=True,
        )
        arguments = ""
        for chunk in stream:
            for call in chunk.choices[0].delta.tool_calls or [] if chunk.choices else []:
                arguments += call.function.arguments or "" if call.function else ""
    WriteDocumentArgs.model_validate_json(arguments)


def test_chat_openai_gets_tool_calls_and_usage_streaming_and_not(llm_server: LlmServers) -> None:
    for streaming in (False, True):
        http = httpx.Client(trust_env=False)
        model = ChatOpenAI(
            base_url=llm_server().base_url + "/v1",
            model=MODEL,
            api_key=SecretStr(API_KEY),
            streaming=streaming,
            stream_usage=True,
            max_retries=0,
            http_client=http,
        ).bind_tools([write_document])
        with http:
            message = model.invoke("Write a report on Crete.")
        assert isinstance(message, AIMessage)
        (call,) = message.tool_calls
        assert call["name"] == "write_document"
        WriteDocumentArgs.model_validate(call["args"])
        assert message.usage_metadata is not None
        assert message.usage_metadata["input_tokens"] > 0
