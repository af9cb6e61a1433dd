"""Fakes for the driver tests: an SSE backend over httpx.MockTransport, a snapshot reader."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import httpx

from pytest_haico.config.experiment import Arm, Script
from pytest_haico.driver.result import ConversationResult
from pytest_haico.driver.snapshots import Snapshot
from pytest_haico.standins.backend_wire import ErrorKind, error_event, sse_data

SERVED = "qwen32b"
TOKEN = "tok-3f9a1c77e2b84d0e9b1d"
THREAD = "thread-0"
BACKEND = "http://127.0.0.1:18080"
ENDPOINT = "http://vllm.localhost:18000/v1"
CANNED = "Sorry, need more steps to process this request."


def sse(payload: dict[str, Any] | str) -> bytes:
    """One SSE event carrying ``payload``: encoded as the stand-in backend encodes its
    events, or sent verbatim when it is a string (to test malformed data)."""
    if isinstance(payload, str):
        return f"data: {payload}\n\n".encode()
    return sse_data(payload).encode()


def step(
    content: Any = "",
    *,
    tool_calls: list[Any] | None = None,
    tool_error: Any = None,
    artifact: Any = None,
    message_type: str = "ai",
    thread_id: str | None = None,
    turn_index: int | None = None,
) -> bytes:
    return sse(
        {
            "type": "step",
            "thread_id": thread_id,
            "turn_index": turn_index,
            "step": {
                "content": content,
                "message_type": message_type,
                "tool_calls": tool_calls or [],
                "tool_error": tool_error,
                "artifact": artifact,
            },
        }
    )


def tool_call(name: str = "search") -> dict[str, Any]:
    return {"id": f"call-{name}", "name": name, "args": {}}


def complete(
    *,
    recursion: bool = False,
    tokens: tuple[int, int] = (100, 20),
    thread_id: str | None = None,
    turn_index: int | None = None,
) -> bytes:
    return sse(
        {
            "type": "complete",
            "thread_id": thread_id,
            "turn_index": turn_index,
            "recursion_limit_reached": recursion,
            "usage": {"tokens_in": tokens[0], "tokens_out": tokens[1]},
        }
    )


def error(kind: str, message: str = "boom") -> bytes:
    # An unknown kind is sent too: the driver must treat it as the backend's error.
    return sse(error_event(cast(ErrorKind, kind), message))


def answer(text: str = "Here is the plan.", **kwargs: Any) -> list[bytes]:
    """The chunks of an ordinary turn: one answer step, then complete."""
    return [step(text), complete(**kwargs)]


@dataclass
class Reply:
    """How the fake backend answers one request."""

    chunks: Sequence[bytes] = ()
    status: int = 200
    content_type: str = "text/event-stream"
    hang: bool = False  # after the chunks, send nothing more and never end
    fail: Exception | None = None  # raised by the body after the chunks
    sent: asyncio.Event = field(default_factory=asyncio.Event)


class FakeBackend:
    """Answers each POST with the next `Reply`, and keeps what it was sent."""

    def __init__(self, *replies: Reply | list[bytes]) -> None:
        self.replies = [r if isinstance(r, Reply) else Reply(chunks=r) for r in replies]
        self.requests: list[httpx.Request] = []

    @property
    def bodies(self) -> list[dict[str, Any]]:
        return [json.loads(request.content) for request in self.requests]

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self._handle)

    def _handle(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if len(self.requests) > len(self.replies):
            raise AssertionError(f"unexpected request #{len(self.requests)}")
        reply = self.replies[len(self.requests) - 1]
        headers = {"content-type": reply.content_type}
        return httpx.Response(reply.status, headers=headers, content=_body(reply))


async def _body(reply: Reply) -> AsyncIterator[bytes]:
    for chunk in reply.chunks:
        yield chunk
    reply.sent.set()
    if reply.fail is not None:
        raise reply.fail
    if reply.hang:
        await asyncio.Event().wait()


class FakeSnapshots:
    """Every turn was served by the arm's model, unless told otherwise per backend turn index."""

    def __init__(
        self,
        *,
        provider: str = "vllm",
        model_id: str = SERVED,
        missing: bool = False,
        served: dict[int, tuple[str, str]] | None = None,
        fail: Exception | None = None,
    ) -> None:
        self.provider = provider
        self.model_id = model_id
        self.missing = missing
        self.served = served or {}
        self.fail = fail
        self.reads: list[tuple[str, int]] = []

    async def read(self, thread_id: str, turn_index: int) -> Snapshot | None:
        self.reads.append((thread_id, turn_index))
        if self.fail is not None:
            raise self.fail
        if self.missing:
            return None
        provider, model_id = self.served.get(turn_index, (self.provider, self.model_id))
        return Snapshot(
            snapshot_id=f"snap-{thread_id}-{turn_index}",
            thread_id=thread_id,
            turn_index=turn_index,
            branch_from=None,
            provider=provider,
            model_id=model_id,
            created_at=datetime.now(UTC),
        )


def make_arm(*, recursion_limit: int = 25, turn_timeout_s: float = 5.0) -> Arm:
    return Arm.model_validate(
        {
            "name": "qwen32b-tp2",
            "model": {"served_name": SERVED},
            "generation": {"max_tokens": 512, "temperature": 0.0},
            "agent": {"recursion_limit": recursion_limit},
            "run": {"turn_timeout_s": turn_timeout_s},
        }
    )


def make_script(*turns: str | dict[str, Any]) -> Script:
    return Script.model_validate(
        {
            "id": "plan-trip",
            "turns": [{"user": t} if isinstance(t, str) else t for t in turns or ("Plan a trip.",)],
        }
    )


@dataclass
class Conversation:
    result: ConversationResult
    backend: FakeBackend
    snapshots: FakeSnapshots
    transcript: Path

    @property
    def lines(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.transcript.read_text().splitlines()]


# The `converse` fixture's type (conftest.py).
Converse = Callable[..., Coroutine[Any, Any, Conversation]]
