"""How each stand-in persona answers a chat request, decided from hash(seed, messages) alone."""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from pytest_haico.standins.openai_wire import (
    ChatRequest,
    NamedToolChoice,
    Reply,
    ToolCall,
    ToolDefinition,
    message_text,
)
from pytest_haico.standins.schema_values import break_arguments, generate_value

# Share of unguided requests that persona flaky answers with a 500.
FLAKY_SHARE = 0.5
# Latency that persona slow adds on top of --latency-ms.
SLOW_EXTRA_MS = 1000
# A user turn that names one of these asks for an artifact, so persona helpful calls a tool.
ARTIFACT_WORDS = re.compile(r"\b(document|write|written|file|report|draft|save)\w*", re.IGNORECASE)
# Tools persona helpful prefers for an artifact, by a word in their name.
_ARTIFACT_TOOL = re.compile(r"document|write|file|report|save", re.IGNORECASE)
_TOPIC_CHARS = 80
# A phrase that persona judge looks for in the answer it judges.
_QUOTED = re.compile(r'"([^"]+)"')

_ANSWERS = (
    "Here is a short answer about {topic}: start with the essentials, then refine.",
    "On {topic}: the key points are scope, order and a clear next step.",
    "Regarding {topic}, a brief plan: outline, check the details, then finish.",
)


class Persona(StrEnum):
    """The stand-in model's behaviour (the arm file's ``[standin] persona``); what each does
    is described once, in ``config/sections.py``'s PERSONAS (the arm reference's table)."""

    HELPFUL = "helpful"
    LOOPER = "looper"
    BAD_ARGS = "bad_args"
    BLANK = "blank"
    FLAKY = "flaky"
    SLOW = "slow"
    HANG = "hang"
    DEAD = "dead"
    JUDGE = "judge"


@dataclass(frozen=True)
class ServerFault:
    """Answer 500, as a crashed engine step does (persona flaky)."""


@dataclass(frozen=True)
class Hang:
    """Never answer; hold the request until the client goes away (persona hang, once the
    conversation goes on)."""


@dataclass(frozen=True)
class EngineDeath:
    """The engine dies: answer 500 with an empty body, then the server exits (persona dead)."""


@dataclass(frozen=True)
class Plan:
    """What to do with one request: wait ``delay_s``, then reply, fail or hang."""

    delay_s: float
    outcome: Reply | ServerFault | Hang | EngineDeath


def request_digest(seed: int, messages: Sequence[dict[str, Any]]) -> bytes:
    """sha256 of the seed and the canonical JSON of the messages: the only source of chance.

    Arrival order, time and concurrency never enter, so a conversation replays identically
    (a flaky conversation fails at the same turn every time).
    """
    canonical = json.dumps(list(messages), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(f"{seed}\0{canonical}".encode()).digest()


def plan_completion(
    request: ChatRequest,
    *,
    persona: Persona,
    seed: int,
    latency_ms: int,
    blank_on: re.Pattern[str] | None = None,
) -> Plan:
    """Decide how *persona* answers *request*.

    A guided request (a named ``tool_choice``, or "required") always gets a valid call whose
    arguments satisfy the tool's schema, whatever the persona, as vLLM's guided decoding
    guarantees: persona flaky does not fail it and persona hang answers it. Only persona dead
    fails it: guided decoding does not keep an engine alive. Latency applies to every request.

    Persona hang answers a conversation's first request as helpful does and holds every
    request that continues one (an assistant or tool message in the history): a model that
    hangs once the context grows. So it passes the dynamic gates, whose probes and canary
    are first requests, and its conversations hang at their second model call.

    ``blank_on`` (``[standin] blank_on``) answers an unguided request blank, whatever the
    persona, when one of its user messages matches: a known set of conversations fails.
    """
    digest = request_digest(seed, request.messages)
    rng = random.Random(digest)
    delay_ms = latency_ms + (SLOW_EXTRA_MS if persona is Persona.SLOW else 0)
    choice = request.effective_tool_choice
    tools = request.tools or []
    topic = _topic(request.messages)
    call_id = _CallIds(digest)

    if persona is Persona.DEAD:
        return Plan(delay_ms / 1000, EngineDeath())
    if isinstance(choice, NamedToolChoice):
        tool = next(t for t in tools if t.function.name == choice.function.name)
        return Plan(delay_ms / 1000, _guided_call(tool, rng, topic, call_id()))
    if choice == "required":
        tool = _artifact_tool(tools)
        return Plan(delay_ms / 1000, _guided_call(tool, rng, topic, call_id()))
    if blank_on is not None and _user_matches(request.messages, blank_on):
        return Plan(delay_ms / 1000, Reply(""))
    if persona is Persona.HANG and continues_conversation(request.messages):
        return Plan(delay_ms / 1000, Hang())
    # The first draw decides flakiness so that it depends on nothing but seed and messages.
    if persona is Persona.FLAKY and rng.random() < FLAKY_SHARE:
        return Plan(delay_ms / 1000, ServerFault())
    return Plan(delay_ms / 1000, _reply(request, persona, rng, topic, call_id))


def _user_matches(messages: Sequence[dict[str, Any]], pattern: re.Pattern[str]) -> bool:
    return any(
        m.get("role") == "user" and pattern.search(message_text(m)) is not None for m in messages
    )


def continues_conversation(messages: Sequence[dict[str, Any]]) -> bool:
    """Whether the request goes on with a conversation: the model already spoke in it (an
    assistant message, or a tool message answering its call)."""
    return any(message.get("role") in ("assistant", "tool") for message in messages)


def _reply(
    request: ChatRequest,
    persona: Persona,
    rng: random.Random,
    topic: str,
    call_id: _CallIds,
) -> Reply:
    tools = (request.tools or []) if request.effective_tool_choice == "auto" else []
    last = request.messages[-1]
    if persona is Persona.BLANK:
        return Reply("")
    if persona is Persona.JUDGE:
        return Reply(judge_answer(_last_user_text(request.messages)))
    if persona is Persona.LOOPER and tools:
        return Reply("", (_valid_call(rng.choice(tools), rng, topic, call_id()),))
    if persona is Persona.BAD_ARGS and tools:
        tool = _artifact_tool(tools)
        valid = json.loads(_valid_call(tool, rng, topic, "").arguments)
        broken = break_arguments(tool.function.parameters or {}, valid)
        return Reply("", (ToolCall(call_id(), tool.function.name, json.dumps(broken)),))
    if last.get("role") == "tool":
        result = " ".join(message_text(last).split())[:_TOPIC_CHARS]
        return Reply(f"Done. The tool reported: {result or 'no output'}")
    if tools and ARTIFACT_WORDS.search(_last_user_text(request.messages)):
        return Reply("", (_valid_call(_artifact_tool(tools), rng, topic, call_id()),))
    return Reply(rng.choice(_ANSWERS).format(topic=f'"{topic}"'))


def judge_answer(text: str) -> str:
    """Persona judge's verdict on a judge prompt (question on the first line, the answer
    judged as the last paragraph): "Yes." when every phrase the question quotes in double
    quotes is in the answer (any case), else "No."; no quoted phrase, "Yes."."""
    question, _, rest = text.strip().partition("\n")
    answer = rest.rpartition("\n\n")[2].lower()
    quoted = _QUOTED.findall(question)
    return "Yes." if all(phrase.lower() in answer for phrase in quoted) else "No."


class _CallIds:
    """Tool call ids derived from the request digest, so replays send identical histories."""

    def __init__(self, digest: bytes) -> None:
        self._digest = digest
        self._count = 0

    def __call__(self) -> str:
        self._count += 1
        suffix = hashlib.sha256(self._digest + bytes([self._count])).hexdigest()[:24]
        return f"chatcmpl-tool-{suffix}"


def _valid_call(tool: ToolDefinition, rng: random.Random, topic: str, call_id: str) -> ToolCall:
    schema = tool.function.parameters or {"type": "object", "properties": {}}
    arguments = generate_value(schema, rng=rng, topic=topic, name=tool.function.name)
    return ToolCall(call_id, tool.function.name, json.dumps(arguments))


def _guided_call(tool: ToolDefinition, rng: random.Random, topic: str, call_id: str) -> Reply:
    return Reply("", (_valid_call(tool, rng, topic, call_id),), guided=True)


def _artifact_tool(tools: Sequence[ToolDefinition]) -> ToolDefinition:
    return next((t for t in tools if _ARTIFACT_TOOL.search(t.function.name)), tools[0])


def _last_user_text(messages: Sequence[dict[str, Any]]) -> str:
    return next((message_text(m) for m in reversed(messages) if m.get("role") == "user"), "")


def _topic(messages: Sequence[dict[str, Any]]) -> str:
    words = " ".join(_last_user_text(messages).split())
    return words[:_TOPIC_CHARS].rstrip() or "the request"
