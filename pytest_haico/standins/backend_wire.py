"""The HAI-Co² backend's query wire format: the request body and the SSE events of a turn."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

ErrorKind = Literal["recursion_limit", "auth", "model", "internal"]

# The agent's limit when a request names none (LangGraph's own default, 10007, would let a
# looping model run for thousands of calls).
DEFAULT_RECURSION_LIMIT = 25


class ModelConfig(BaseModel):
    """``config.model``: which OpenAI-compatible endpoint and model serve the turn.

    Frozen, so that it is hashable: the backend keeps one compiled agent per model config.
    """

    model_config = ConfigDict(protected_namespaces=(), frozen=True)
    API: Literal["openai"]
    model_id: str = Field(min_length=1)
    endpoint_url: str
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0)


class AgentConfig(BaseModel):
    """``config.agent``."""

    recursion_limit: int = Field(default=DEFAULT_RECURSION_LIMIT, ge=1)


class QueryConfig(BaseModel):
    """``config``."""

    model: ModelConfig
    agent: AgentConfig = Field(default_factory=AgentConfig)


class QueryRequest(BaseModel):
    """The body of ``POST /api/query/stream_steps/sse``."""

    query: str
    thread_id: str | None = Field(default=None, min_length=1)
    branch_from_turn: int | None = Field(default=None, ge=0)
    config: QueryConfig


def step_event(
    thread_id: str,
    turn_index: int,
    *,
    content: str,
    message_type: str,
    tool_calls: list[dict[str, Any]],
    tool_error: bool,
    artifact: Any,
) -> dict[str, Any]:
    """One graph step: a message the agent or a tool produced."""
    return {
        "type": "step",
        "thread_id": thread_id,
        "turn_index": turn_index,
        "step": {
            "content": content,
            "message_type": message_type,
            "tool_calls": tool_calls,
            "tool_error": tool_error,
            "artifact": artifact,
        },
    }


def complete_event(
    thread_id: str,
    turn_index: int,
    *,
    recursion_limit_reached: bool,
    tokens_in: int,
    tokens_out: int,
) -> dict[str, Any]:
    """The turn's graph ended normally (possibly on LangGraph's canned recursion reply)."""
    return {
        "type": "complete",
        "thread_id": thread_id,
        "turn_index": turn_index,
        "recursion_limit_reached": recursion_limit_reached,
        "usage": {"tokens_in": tokens_in, "tokens_out": tokens_out},
    }


def error_event(kind: ErrorKind, message: str) -> dict[str, Any]:
    """The turn failed; *message* has already been redacted."""
    return {"type": "error", "kind": kind, "error": message}


def sse_data(event: dict[str, Any]) -> str:
    """One server-sent event: a ``data:`` line with the JSON event and a blank line."""
    return f"data: {json.dumps(event, separators=(',', ':'), default=str)}\n\n"
