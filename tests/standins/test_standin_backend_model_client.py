"""The backend's model calls: the lean client and the merged stream send, read and raise exactly
what the SDK and ChatOpenAI do."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import openai
import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_openai import ChatOpenAI
from langchain_openai.chat_models._client_utils import StreamChunkTimeoutError

from pytest_haico.standins.agent import write_document
from pytest_haico.standins.backend_wire import ModelConfig
from pytest_haico.standins.model_client import (
    LeanCompletions,
    ModelHttpClients,
    build_chat_model,
)
from pytest_haico.standins.model_stream import LeanChatOpenAI

CONFIG = ModelConfig(
    API="openai",
    model_id="m",
    endpoint_url="http://vllm.localhost:9/v1",
    max_tokens=64,
    temperature=0.0,
)
HISTORY: list[BaseMessage] = [
    HumanMessage("Write a report on Crete."),
    AIMessage(
        "",
        tool_calls=[
            {
                "id": "call-1",
                "name": "write_document",
                "args": {"action_and_reasoning": "asked", "title": "Crete", "content": "..."},
            }
        ],
    ),
    ToolMessage("Wrote it.", tool_call_id="call-1", artifact={"type": "document"}),
    HumanMessage("And one on Rhodes?"),
]


def chunk(delta: dict[str, Any] | None, finish: str | None = None, usage: Any = None) -> bytes:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    body = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    body |= {"choices": choices, "usage": usage}
    return f"data: {json.dumps(body)}\n\n".encode()


CALL = {"index": 0, "id": "call-2", "type": "function"}
STREAM = b"".join(
    [
        chunk({"role": "assistant", "content": ""}),
        chunk({"content": "On Rhodes"}),
        chunk({"tool_calls": [{**CALL, "function": {"name": "write_document", "arguments": ""}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"title": "R"}'}}]}),
        chunk({}, finish="tool_calls"),
        chunk(None, usage={"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12}),
        b"data: [DONE]\n\n",
    ]
)


def clients(answer: Callable[[httpx.Request], httpx.Response]) -> ModelHttpClients:
    transport = httpx.MockTransport(answer)
    return ModelHttpClients(
        sync=httpx.Client(transport=transport), asynchronous=httpx.AsyncClient(transport=transport)
    )


async def call_model(
    answer: Callable[[httpx.Request], httpx.Response],
    *,
    lean: bool,
    chunk_timeout: float | None = None,
) -> tuple[AIMessage | BaseException, list[httpx.Request]]:
    """One streamed call over HISTORY with the tool bound; what it returned and sent. Stock:
    the same model with ChatOpenAI's own methods and the SDK's own completions client."""
    sent: list[httpx.Request] = []

    def record(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return answer(request)

    model = build_chat_model(CONFIG, api_key="key", http_clients=clients(record))
    assert type(model) is LeanChatOpenAI
    assert isinstance(model.async_client, LeanCompletions)
    if chunk_timeout is not None:
        model.stream_chunk_timeout = chunk_timeout
    if not lean:
        object.__setattr__(model, "__class__", ChatOpenAI)  # same fields, stock _astream
        model.async_client = model.root_async_client.chat.completions
    try:
        reply = await model.bind_tools([write_document]).ainvoke(HISTORY)
    except Exception as exc:
        return exc, sent
    assert isinstance(reply, AIMessage)
    return reply, sent


def streamed(request: httpx.Request) -> httpx.Response:
    return httpx.Response(200, content=STREAM, headers={"content-type": "text/event-stream"})


def as_sent(request: httpx.Request) -> tuple[str, str, dict[str, str], Any]:
    """What the model server sees: the body as JSON (the SDK orders its keys by its own
    signature, ChatOpenAI's payload by its; a JSON object's order carries nothing)."""
    return request.method, str(request.url), dict(request.headers), json.loads(request.read())


@pytest.mark.asyncio
async def test_the_request_is_the_sdks() -> None:
    _, stock = await call_model(streamed, lean=False)
    _, lean = await call_model(streamed, lean=True)
    assert [as_sent(r) for r in lean] == [as_sent(r) for r in stock]
    body = as_sent(lean[0])[3]
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert [m["role"] for m in body["messages"]] == ["user", "assistant", "tool", "user"]
    assert body["tools"][0]["function"]["name"] == "write_document"


def sse(*chunks: bytes) -> Callable[[httpx.Request], httpx.Response]:
    content = b"".join(chunks)
    return lambda request: httpx.Response(
        200, content=content, headers={"content-type": "text/event-stream"}
    )


USAGE = chunk(None, usage={"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12})
DONE = b"data: [DONE]\n\n"
SECOND = {"index": 1, "id": "call-3", "type": "function"}
STREAMS = {
    "text and a tool call": streamed,
    "text only": sse(
        chunk({"role": "assistant", "content": ""}),
        *(chunk({"content": word}) for word in ("On", " Rhodes", ",", " the", " sun.")),
        chunk({}, finish="stop"),
        USAGE,
        DONE,
    ),
    "two tool calls, interleaved": sse(
        chunk({"role": "assistant", "content": None}),
        chunk({"tool_calls": [{**CALL, "function": {"name": "write_document", "arguments": ""}}]}),
        chunk({"tool_calls": [{**SECOND, "function": {"name": "write_", "arguments": '{"ti'}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"title": "A"}'}}]}),
        chunk({"tool_calls": [{"index": 1, "function": {"name": "document"}}]}),
        chunk({"tool_calls": [{**SECOND, "function": {"arguments": 'tle": 1}'}}]}),  # id again
        chunk({}, finish="tool_calls"),
        USAGE,
        DONE,
    ),
    "arguments cut at max_tokens": sse(
        chunk({"role": "assistant", "content": ""}),
        chunk({"tool_calls": [{**CALL, "function": {"name": "write_document", "arguments": ""}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"title": "Rho'}}]}),
        chunk({}, finish="length"),
        USAGE,
        DONE,
    ),
    "odd chunks: no delta, no choices, no usage": sse(
        chunk({"role": "assistant", "content": "On"}),
        b'data: {"id": "c1", "choices": [{"index": 0, "delta": null, "finish_reason": "x"}]}\n\n',
        chunk(None),
        chunk({"content": " Rhodes"}, finish="stop"),
        DONE,
    ),
    "nothing but the end": sse(DONE),
}


@pytest.mark.asyncio
@pytest.mark.parametrize("answer", STREAMS.values(), ids=STREAMS.keys())
async def test_the_streamed_reply_is_read_alike(
    answer: Callable[[httpx.Request], httpx.Response],
) -> None:
    stock, _ = await call_model(answer, lean=False)
    lean, _ = await call_model(answer, lean=True)
    if isinstance(stock, BaseException):
        assert type(lean) is type(stock) and str(lean) == str(stock)
        return
    assert isinstance(lean, AIMessage)
    for field in ("content", "tool_calls", "invalid_tool_calls", "additional_kwargs"):
        assert getattr(lean, field) == getattr(stock, field), field
    assert lean.usage_metadata == stock.usage_metadata
    assert lean.response_metadata == stock.response_metadata


@pytest.mark.asyncio
async def test_the_merged_reply_is_the_first_streams() -> None:
    lean, _ = await call_model(streamed, lean=True)
    assert isinstance(lean, AIMessage)
    assert lean.content == "On Rhodes"
    assert lean.tool_calls[0]["args"] == {"title": "R"}
    assert lean.usage_metadata is not None and lean.usage_metadata["total_tokens"] == 12
    assert lean.response_metadata["finish_reason"] == "tool_calls"


def stalled(request: httpx.Request) -> httpx.Response:
    async def body() -> AsyncIterator[bytes]:
        yield chunk({"role": "assistant", "content": "On"})
        await asyncio.sleep(30)  # cancelled by the chunk timeout

    return httpx.Response(200, content=body(), headers={"content-type": "text/event-stream"})


@pytest.mark.asyncio
async def test_a_stalled_stream_ends_by_the_chunk_timeout_alike() -> None:
    stock, _ = await call_model(stalled, lean=False, chunk_timeout=0.2)
    lean, _ = await call_model(stalled, lean=True, chunk_timeout=0.2)
    assert isinstance(stock, StreamChunkTimeoutError)
    assert isinstance(lean, StreamChunkTimeoutError)
    assert type(lean) is type(stock) and str(lean) == str(stock)
    assert lean.chunks_received == stock.chunks_received == 1


def refused(request: httpx.Request) -> httpx.Response:
    return httpx.Response(401, json={"error": {"message": "bad key", "type": "auth"}})


def broken_stream(request: httpx.Request) -> httpx.Response:
    content = chunk({"content": "On"}) + b'data: {"error": {"message": "engine died"}}\n\n'
    return httpx.Response(200, content=content, headers={"content-type": "text/event-stream"})


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("answer", "error"),
    [(refused, openai.AuthenticationError), (broken_stream, openai.APIError)],
)
async def test_errors_are_the_sdks(
    answer: Callable[[httpx.Request], httpx.Response], error: type[Exception]
) -> None:
    stock, _ = await call_model(answer, lean=False)
    lean, _ = await call_model(answer, lean=True)
    assert type(lean) is type(stock)
    assert isinstance(lean, error)
    assert str(lean) == str(stock)
