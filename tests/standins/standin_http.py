"""Secrets, tool definitions and HTTP helpers shared by the stand-ins' tests."""

from __future__ import annotations

import json
import uuid
from typing import Any

import httpx
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import BaseModel, Field

from pytest_haico.standins.agent import write_document

API_KEY = "test-vllm-key-" + uuid.uuid4().hex
ADMIN_TOKEN = "test-admin-token-" + uuid.uuid4().hex
MODEL = "standin-model"
TIMEOUT = httpx.Timeout(30.0)


class PlaceOrder(BaseModel):
    """A second tool whose schema has constraints, nesting and enums."""

    action_and_reasoning: str
    item: str = Field(min_length=3, max_length=20)
    quantity: int = Field(ge=2, le=9)
    speed: str = Field(pattern="^(fast|slow)$")
    lines: list[dict[str, int]] = Field(min_length=1)


# Exactly what ChatOpenAI sends for the backend's tool.
WRITE_DOCUMENT_TOOL = convert_to_openai_tool(write_document)
PLACE_ORDER_TOOL = {
    "type": "function",
    "function": {
        "name": "place_order",
        "description": "Place an order.",
        "parameters": PlaceOrder.model_json_schema(),
    },
}
TOOLS = [WRITE_DOCUMENT_TOOL, PLACE_ORDER_TOOL]


def get(url: str, **options: Any) -> httpx.Response:
    """``httpx.get`` that ignores proxy settings: everything here is on loopback."""
    return httpx.get(url, trust_env=False, **options)


def post(url: str, **options: Any) -> httpx.Response:
    """``httpx.post`` that ignores proxy settings: everything here is on loopback."""
    return httpx.post(url, trust_env=False, **options)


def auth(key: str = API_KEY) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def user(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


def continued(text: str) -> list[dict[str, Any]]:
    """A conversation the model has answered once, going on: persona hang holds it."""
    return [*user(text), {"role": "assistant", "content": "Noted."}, *user("Go on.")]


def chat(
    base_url: str,
    messages: list[dict[str, Any]],
    *,
    key: str = API_KEY,
    timeout: httpx.Timeout | float = TIMEOUT,
    **fields: Any,
) -> httpx.Response:
    """POST a chat completion to a stand-in vLLM and return the whole response."""
    body = {"model": MODEL, "messages": messages, **fields}
    return post(f"{base_url}/v1/chat/completions", json=body, headers=auth(key), timeout=timeout)


def message_of(response: httpx.Response) -> dict[str, Any]:
    """The assistant message of a non-streamed completion (asserting it succeeded)."""
    assert response.status_code == 200, response.text
    message: dict[str, Any] = response.json()["choices"][0]["message"]
    return message


def tool_arguments(message: dict[str, Any]) -> dict[str, Any]:
    """The decoded arguments of the message's only tool call."""
    (call,) = message["tool_calls"]
    arguments: dict[str, Any] = json.loads(call["function"]["arguments"])
    return arguments


def sse_data(text: str) -> list[str]:
    """The ``data:`` payloads of an SSE body, in order (asserting nothing else is in it)."""
    payloads = []
    for block in text.split("\n\n"):
        if not block.strip():
            continue
        assert block.startswith("data: "), block
        payloads.append(block.removeprefix("data: "))
    return payloads


def run_turn(
    base_url: str,
    query: str,
    endpoint_url: str,
    *,
    thread_id: str | None,
    branch_from_turn: int | None = None,
    recursion_limit: int = 10,
    token: str = ADMIN_TOKEN,
    model_id: str = MODEL,
) -> list[dict[str, Any]]:
    """One turn through a stand-in backend; return its decoded events."""
    body = {
        "query": query,
        "thread_id": thread_id,
        "branch_from_turn": branch_from_turn,
        "config": {
            "model": {
                "API": "openai",
                "model_id": model_id,
                "endpoint_url": endpoint_url,
                "max_tokens": 512,
                "temperature": 0.0,
            },
            "agent": {"recursion_limit": recursion_limit},
        },
    }
    response = post_query(base_url, body, token=token)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/event-stream")
    return [json.loads(data) for data in sse_data(response.text)]


def post_query(base_url: str, body: dict[str, Any], *, token: str = ADMIN_TOKEN) -> httpx.Response:
    return post(
        f"{base_url}/api/query/stream_steps/sse", json=body, headers=auth(token), timeout=TIMEOUT
    )
