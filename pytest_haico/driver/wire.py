"""The backend's wire format: the query request and the typed step, complete and error events.

Everything that depends on one build of the HAI-Co² API lives here, so adapting
the harness to another build is a change to this module only. Parsing is
tolerant: unknown fields are ignored and unknown event types are passed through.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from pytest_haico.config.experiment import Arm, Turn
from pytest_haico.errors import WireError

STREAM_PATH = "/api/query/stream_steps/sse"

# What LangGraph's prebuilt ReAct agent answers when it runs out of steps; at an
# even recursion limit the graph then ends normally, so this text can be the
# only sign that a turn hit the limit (notes/stand-ins.md).
CANNED_RECURSION_REPLY = "Sorry, need more steps to process this request."

ERROR_KIND_RECURSION_LIMIT = "recursion_limit"


class _Wire(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class Step(_Wire):
    """One message the agent produced during a turn."""

    content: Any = None
    message_type: str | None = None
    tool_calls: list[Any] = Field(default_factory=list)
    tool_error: Any = None
    artifact: Any = None

    @field_validator("tool_calls", mode="before")
    @classmethod
    def _null_is_empty(cls, value: Any) -> Any:
        return [] if value is None else value

    @property
    def text(self) -> str:
        """The content as plain text (LangChain may send a list of content blocks)."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        if isinstance(self.content, list):
            parts = []
            for block in self.content:
                if isinstance(block, str):
                    parts.append(block)
                elif isinstance(block, dict) and isinstance(block.get("text"), str):
                    parts.append(block["text"])
            return "".join(parts)
        return str(self.content)

    @property
    def tool_names(self) -> list[str]:
        """The names of the tools this step calls (``{"name"}``, or OpenAI's
        ``{"function": {"name"}}``); a call without a readable name is left out."""
        names = []
        for call in self.tool_calls:
            if not isinstance(call, dict):
                continue
            function = call.get("function")
            name = call.get("name")
            if name is None and isinstance(function, dict):
                name = function.get("name")
            if isinstance(name, str):
                names.append(name)
        return names

    @property
    def has_tool_error(self) -> bool:
        # Builds differ: a flag, an error message, or null.
        return bool(self.tool_error)

    @property
    def has_artifact(self) -> bool:
        return bool(self.artifact)

    @property
    def is_canned_recursion_reply(self) -> bool:
        return not self.tool_calls and self.text.strip() == CANNED_RECURSION_REPLY


class Usage(_Wire):
    """Token counts of one turn."""

    tokens_in: int | None = None
    tokens_out: int | None = None


class StepEvent(_Wire):
    """``{"type": "step", ...}``: one agent step of the turn."""

    type: Literal["step"]
    thread_id: str | None = None
    turn_index: int | None = None
    step: Step


class CompleteEvent(_Wire):
    """``{"type": "complete", ...}``: the turn ended; the last event of the stream."""

    type: Literal["complete"]
    thread_id: str | None = None
    turn_index: int | None = None
    recursion_limit_reached: bool = False
    usage: Usage = Usage()

    @field_validator("usage", mode="before")
    @classmethod
    def _null_usage(cls, value: Any) -> Any:
        return {} if value is None else value


class ErrorEvent(_Wire):
    """``{"type": "error", ...}``: the turn failed; the last event of the stream."""

    type: Literal["error"]
    # "recursion_limit" | "auth" | "model" | "internal"; any other kind is
    # treated like "internal" rather than refused.
    kind: str = "internal"
    error: str = ""
    thread_id: str | None = None
    turn_index: int | None = None

    @field_validator("error", mode="before")
    @classmethod
    def _stringify(cls, value: Any) -> Any:
        return "" if value is None else value if isinstance(value, str) else json.dumps(value)

    @property
    def is_recursion_limit(self) -> bool:
        return self.kind == ERROR_KIND_RECURSION_LIMIT


class OtherEvent(_Wire):
    """An event type this build of the harness does not know; recorded, otherwise ignored."""

    type: str


BackendEvent = StepEvent | CompleteEvent | ErrorEvent | OtherEvent
TerminalEvent = CompleteEvent | ErrorEvent

_EVENT_TYPES: dict[str, type[StepEvent | CompleteEvent | ErrorEvent]] = {
    "step": StepEvent,
    "complete": CompleteEvent,
    "error": ErrorEvent,
}


def stream_url(backend_url: str) -> str:
    """The streaming query endpoint under ``backend_url``."""
    return backend_url.rstrip("/") + STREAM_PATH


def build_headers(token: str) -> dict[str, str]:
    """The request headers: the admin token as a bearer credential, an event stream wanted."""
    return {
        "Authorization": f"Bearer {token}",
        "Accept": "text/event-stream",
        "Cache-Control": "no-store",
    }


def build_query_body(
    arm: Arm,
    turn: Turn,
    *,
    thread_id: str,
    branch_from_turn: int | None,
    endpoint_url: str,
) -> dict[str, Any]:
    """The JSON body of one turn's query."""
    return {
        "query": turn.user,
        "thread_id": thread_id,
        "branch_from_turn": branch_from_turn,
        "config": {
            "model": {
                "API": "openai",
                "model_id": arm.served_name,
                "endpoint_url": endpoint_url,
                "max_tokens": arm.generation.max_tokens,
                "temperature": arm.generation.temperature,
            },
            "agent": {"recursion_limit": arm.agent.recursion_limit},
        },
    }


def parse_payload(data: str) -> dict[str, Any]:
    """The JSON object carried by one SSE event's data."""
    try:
        payload = json.loads(data)
    except json.JSONDecodeError as exc:
        raise WireError(f"event data is not JSON ({exc.msg}): {data[:200]!r}") from None
    if not isinstance(payload, dict):
        raise WireError(f"event data is not a JSON object: {data[:200]!r}")
    return payload


def parse_event(payload: dict[str, Any]) -> BackendEvent:
    """The typed event for a decoded payload; raises `WireError` when a known type is malformed."""
    kind = payload.get("type")
    if not isinstance(kind, str):
        raise WireError(f"event without a string 'type': {json.dumps(payload)[:200]}")
    model = _EVENT_TYPES.get(kind)
    try:
        if model is None:
            return OtherEvent.model_validate(payload)
        return model.model_validate(payload)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or '<event>'}: {e['msg']}" for e in exc.errors()
        )
        raise WireError(f"malformed {kind!r} event: {problems}") from None
