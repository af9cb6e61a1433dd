"""The dynamic gates' HTTP exchanges: error bodies read both ways, retries after a 5xx only,
every wait bounded (against `httpx.MockTransport`)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from pytest_haico.gates.probes import error_message, get, post

Handler = Callable[[httpx.Request], httpx.Response]


def client_for(handler: Handler) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.MockTransport(handler), trust_env=False)


def numbered(attempt: int) -> dict[str, Any]:
    return {"attempt": attempt}


@pytest.mark.parametrize(
    ("body", "text", "message"),
    [
        ({"object": "error", "message": "flat (0.10.0)", "code": 400}, "", "flat (0.10.0)"),
        ({"error": {"message": "nested (0.10.1)", "type": "x"}}, "", "nested (0.10.1)"),
        ({"error": "Unauthorized"}, "", "Unauthorized"),
        ({"detail": "missing or invalid admin token"}, "", "missing or invalid admin token"),
        (None, "", "(empty body)"),
        (None, "  Internal\n Server Error ", "Internal Server Error"),
    ],
)
def test_error_messages_are_read_in_every_shape(body: Any, text: str, message: str) -> None:
    assert error_message(body, text) == message


@pytest.mark.asyncio
async def test_a_5xx_is_retried_with_a_new_body_until_an_answer() -> None:
    seen: list[bytes] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.content)
        if len(seen) < 3:
            return httpx.Response(500, json={"error": {"message": "engine hiccup"}})
        return httpx.Response(200, json={"choices": []})

    async with client_for(handler) as client:
        reply = await post(
            client, "http://x/v1/chat", headers={}, body_for=numbered, attempts=5, timeout_s=10
        )
    assert reply.status == 200
    assert seen == [b'{"attempt":1}', b'{"attempt":2}', b'{"attempt":3}']
    assert reply.describe() == (
        "HTTP 200 (after 2 retries: HTTP 500 'engine hiccup', HTTP 500 'engine hiccup')"
    )


@pytest.mark.asyncio
async def test_a_4xx_or_a_refused_connection_is_final() -> None:
    calls = 0

    def refuse(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        return httpx.Response(400, json={"message": "bad request"})

    async with client_for(refuse) as client:
        reply = await post(
            client, "http://x/", headers={}, body_for=numbered, attempts=5, timeout_s=5
        )
    assert (calls, reply.describe()) == (1, "HTTP 400: bad request")

    def unreachable(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("[Errno 111] Connection refused")

    async with client_for(unreachable) as client:
        reply = await post(
            client, "http://x/", headers={}, body_for=numbered, attempts=5, timeout_s=5
        )
    assert reply.describe() == "POST http://x/: ConnectError: [Errno 111] Connection refused"


@pytest.mark.asyncio
async def test_attempts_run_out_on_a_server_that_keeps_failing() -> None:
    def broken(request: httpx.Request) -> httpx.Response:
        return httpx.Response(500)

    async with client_for(broken) as client:
        reply = await post(
            client, "http://x/", headers={}, body_for=numbered, attempts=3, timeout_s=5
        )
    assert reply.describe() == "HTTP 500: (empty body) (after 2 retries: HTTP 500, HTTP 500)"


@pytest.mark.asyncio
async def test_a_probe_that_gets_no_answer_ends_at_its_timeout() -> None:
    async def hang(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(30)
        raise AssertionError("unreachable")

    transport = httpx.MockTransport(hang)
    async with httpx.AsyncClient(transport=transport, trust_env=False) as client:
        reply = await get(client, "http://x/v1/models", headers={}, timeout_s=0.2)
    assert reply.status is None
    assert reply.describe() == "GET http://x/v1/models: no answer within 0.2 s"
