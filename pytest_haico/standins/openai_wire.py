"""vLLM's OpenAI-compatible chat wire format: requests, token counts, replies, chunks, errors."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from pytest_haico.standins.vllm_versions import VllmVersion

# Size of the argument fragments of a streamed tool call; small enough that every real call
# arrives in several pieces, as it does from vLLM's tool parsers.
ARGUMENT_FRAGMENT_CHARS = 16


class FunctionDefinition(BaseModel):
    """``tools[].function``: a name, a description and a JSON schema of the parameters."""

    model_config = ConfigDict(extra="allow")
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None


class ToolDefinition(BaseModel):
    """One entry of ``tools``."""

    model_config = ConfigDict(extra="allow")
    type: Literal["function"] = "function"
    function: FunctionDefinition


class NamedFunction(BaseModel):
    """The function a named ``tool_choice`` forces."""

    name: str


class NamedToolChoice(BaseModel):
    """``tool_choice: {"type": "function", "function": {"name": ...}}``."""

    type: Literal["function"] = "function"
    function: NamedFunction


class StreamOptions(BaseModel):
    """``stream_options``; vLLM defaults ``include_usage`` to true once the object is given."""

    model_config = ConfigDict(extra="allow")
    include_usage: bool | None = True


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class ChatRequest(BaseModel):
    """The part of a chat completion request that a stand-in model acts on; the rest is ignored."""

    model_config = ConfigDict(extra="allow")
    messages: list[dict[str, Any]] = Field(min_length=1)
    model: str | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    tools: list[ToolDefinition] | None = None
    tool_choice: ToolChoice | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)

    @property
    def token_limit(self) -> int | None:
        """The completion budget; ``max_completion_tokens`` wins over the older ``max_tokens``."""
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens
        return self.max_tokens

    @property
    def effective_tool_choice(self) -> ToolChoice:
        """``tool_choice`` as vLLM resolves it: "auto" when tools are given without a choice."""
        if not self.tools:
            return "none"
        return self.tool_choice if self.tool_choice is not None else "auto"

    @property
    def include_usage(self) -> bool:
        """Whether a stream ends with a usage chunk."""
        return bool(self.stream_options and self.stream_options.include_usage)


@dataclass(frozen=True)
class ToolCall:
    """One tool call of a reply; ``arguments`` is JSON text, as on the wire."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class Reply:
    """What the stand-in model answers: text, tool calls, or (persona blank) neither.

    *guided*: the call was forced by a named or "required" ``tool_choice`` and decoded against
    the tool's schema; vLLM reports it differently from a call its tool parser found.
    """

    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    guided: bool = False


@dataclass(frozen=True)
class Usage:
    """Token counts of one completion."""

    prompt_tokens: int
    completion_tokens: int

    def as_json(self) -> dict[str, int]:
        """The ``usage`` object of a response or of the final stream chunk."""
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
        }


def count_tokens(text: str) -> int:
    """A deterministic stand-in for a tokenizer: one token per four characters, rounded up."""
    return (len(text) + 3) // 4


def message_text(message: dict[str, Any]) -> str:
    """The text of a message whose content is a string, a list of parts, or null."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""


def count_prompt_tokens(request: ChatRequest) -> int:
    """Tokens of the prompt: each message's text and tool calls plus the tool definitions."""
    total = 0
    for message in request.messages:
        total += 3 + count_tokens(message_text(message))  # 3: the role and the separators
        if message.get("tool_calls"):
            total += count_tokens(json.dumps(message["tool_calls"]))
    if request.tools:
        total += count_tokens(json.dumps([t.model_dump() for t in request.tools]))
    return total


def count_completion_tokens(reply: Reply) -> int:
    """Tokens of a reply, at least one (the end-of-sequence token of a blank answer).

    A guided call's name is forced by the grammar, so only its arguments are generated.
    """
    calls = sum(
        count_tokens(c.arguments) + (0 if reply.guided else count_tokens(c.name))
        for c in reply.tool_calls
    )
    return max(1, count_tokens(reply.content) + calls)


def truncate(reply: Reply, limit: int | None) -> tuple[Reply, str]:
    """Cut the reply to *limit* tokens; return it with its (non-streamed) finish reason.

    A guided call is generated like text, so ``max_tokens`` cuts its arguments (invalid JSON,
    "length"); a complete one finishes "stop", never "tool_calls", as in vLLM's non-streamed
    answer. A call a tool parser found is never cut: the stand-in's are always complete.
    """
    if reply.guided:
        cut = tuple(
            ToolCall(c.id, c.name, c.arguments[: limit * 4] if limit is not None else c.arguments)
            for c in reply.tool_calls
        )
        if cut != reply.tool_calls:
            return Reply(reply.content, cut, guided=True), "length"
        return reply, "stop"
    if reply.tool_calls:
        return reply, "tool_calls"
    if limit is not None and count_tokens(reply.content) > limit:
        return Reply(reply.content[: limit * 4]), "length"
    return reply, "stop"


def reported_finish_reason(
    chat: ChatRequest, reply: Reply, finish_reason: str, version: VllmVersion, *, streamed: bool
) -> str:
    """The finish reason vLLM reports for *reply*, which `truncate` gave *finish_reason*."""
    if not reply.guided:
        return finish_reason
    if version.finishes_calls_by_choice:
        # "stop" becomes "tool_calls" for "required" only; a named choice keeps it.
        required = chat.tool_choice == "required" and finish_reason == "stop"
        return "tool_calls" if required else finish_reason
    # Before: streamed, vLLM ended a guided call with "tool_calls" once it sent one.
    return "tool_calls" if streamed else finish_reason


def completion_body(
    *, completion_id: str, created: int, model: str, reply: Reply, finish_reason: str, usage: Usage
) -> dict[str, Any]:
    """A non-streaming ``chat.completion`` object."""
    message: dict[str, Any] = {"role": "assistant", "content": reply.content}
    if reply.tool_calls:
        # vLLM answers a guided call with content "", a parsed one with null.
        message["content"] = reply.content if reply.guided else reply.content or None
        message["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in reply.tool_calls
        ]
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {"index": 0, "message": message, "logprobs": None, "finish_reason": finish_reason}
        ],
        "usage": usage.as_json(),
    }


def iter_chunk_bodies(
    *,
    completion_id: str,
    created: int,
    model: str,
    reply: Reply,
    finish_reason: str,
    usage: Usage | None,
    lean: bool = False,
) -> Iterator[dict[str, Any]]:
    """The ``chat.completion.chunk`` objects of a streamed reply, in order.

    Role first, then text pieces; each tool call as a header (index, id, name, empty
    arguments) followed by argument fragments; then the finish reason; then, when *usage* is
    given (``stream_options.include_usage``), a chunk with no choices and the usage.

    *lean* (vLLM 0.32, `VllmVersion.streams_lean_chunks`): no ``usage: null`` on each chunk,
    a header without ``arguments``, ``content: null`` beside each tool-call delta, and a
    "length" finish on the last generated piece rather than a chunk of its own.
    """
    usage_field: dict[str, Any] = {"usage": None} if usage is not None and not lean else {}

    def chunk(delta: dict[str, Any], reason: str | None = None) -> dict[str, Any]:
        return {
            "id": completion_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}],
            **usage_field,
        }

    call_delta: dict[str, Any] = {"content": None} if lean else {}
    deltas: list[dict[str, Any]] = [
        {"content": p} for p in re.findall(r"\S+\s*|\s+", reply.content)
    ]
    for index, call in enumerate(reply.tool_calls):
        function = {"name": call.name} if lean else {"name": call.name, "arguments": ""}
        header = {"index": index, "id": call.id, "type": "function", "function": function}
        deltas.append({**call_delta, "tool_calls": [header]})
        for start in range(0, len(call.arguments), ARGUMENT_FRAGMENT_CHARS):
            fragment = call.arguments[start : start + ARGUMENT_FRAGMENT_CHARS]
            piece = {"index": index, "function": {"arguments": fragment}}
            deltas.append({**call_delta, "tool_calls": [piece]})
    yield chunk({"role": "assistant", "content": ""})
    finish_on_last = lean and finish_reason == "length" and bool(deltas)
    for number, delta in enumerate(deltas, start=1):
        last = number == len(deltas)
        yield chunk(delta, finish_reason if finish_on_last and last else None)
    if not finish_on_last:
        yield chunk({}, finish_reason)
    if usage is not None:
        yield {
            "id": completion_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [],
            "usage": usage.as_json(),
        }


def model_list(
    served_model_names: Sequence[str], *, root: str, max_model_len: int, created: int
) -> dict[str, Any]:
    """``GET /v1/models``: one card per served name, each with vLLM's ``permission`` entry."""
    cards = [
        {
            "id": name,
            "object": "model",
            "created": created,
            "owned_by": "vllm",
            "root": root,
            "parent": None,
            "max_model_len": max_model_len,
            "permission": [_model_permission(created)],
        }
        for name in served_model_names
    ]
    return {"object": "list", "data": cards}


def _model_permission(created: int) -> dict[str, object]:
    """The ``permission`` entry of a model card, as vLLM fills it."""
    return {
        "id": f"modelperm-{uuid.uuid4().hex[:16]}",
        "object": "model_permission",
        "created": created,
        "allow_create_engine": False,
        "allow_sampling": True,
        "allow_logprobs": True,
        "allow_search_indices": False,
        "allow_view": True,
        "allow_fine_tuning": False,
        "organization": "*",
        "group": None,
        "is_blocking": False,
    }


def error_body(
    message: str, *, error_type: str, code: int, nested: bool, param: str | None = None
) -> dict[str, Any]:
    """vLLM's error object: ``{"error": {"message", "type", "param", "code"}}`` when *nested*
    (vLLM 0.10.1 on), else the older flat ``{"object": "error", "message", ...}``."""
    fields = {"message": message, "type": error_type, "param": param, "code": code}
    return {"error": fields} if nested else {"object": "error", **fields}


def sse_data(payload: dict[str, Any] | str) -> str:
    """One server-sent event carrying a JSON object, or the literal ``[DONE]``."""
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n"
