"""Dynamic gates of the model server: once the stack is up, before the arm's first item, probe
what the experiment's meaning depends on — never the quality of the model (a weak model is a
result). The backend's gates are in `backend`.

Each gate takes an `httpx.AsyncClient` (the caller makes it with ``trust_env=False``: a
cluster's proxy must not capture loopback) and the OpenAI base URL of the model server,
``http://127.0.0.1:<port>/v1`` (or ``--haico-model-endpoint``). Probes whose answer a model
generates without guidance are retried after a 5xx with a new prompt each time: a stand-in
``flaky`` model fails a seeded share of prompts, a real transient 5xx is rare, and a dead
engine refuses the connection next, which is final.
"""

from __future__ import annotations

import json
from typing import Any

import httpx

from pytest_haico.config.experiment import Arm
from pytest_haico.gates.probes import bearer, get, post
from pytest_haico.gates.result import GateResult, failed, passed

SERVED_MODEL = "served_model"
# Static, as served_model: the judge an arm's scripts ask is served and its job runs.
JUDGE = "judge"
MAX_MODEL_LEN = "max_model_len"
COMPLETION = "completion"
API_KEY = "api_key"
TOOL_CHOICE_AUTO = "tool_choice_auto"
TOOL_CALL_STRUCTURE = "tool_call_structure"

GENERATION_ATTEMPTS = 12
STRUCTURE_MAX_TOKENS = 256
TOOL_FLAGS = ("--enable-auto-tool-choice", "--tool-call-parser")

# A tool as LangChain's ChatOpenAI sends one (convert_to_openai_tool of a typed function).
PROBE_TOOL_NAME = "record_answer"
PROBE_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": PROBE_TOOL_NAME,
        "description": "Record a one-word answer.",
        "parameters": {
            "type": "object",
            "properties": {"answer": {"type": "string", "description": "The answer."}},
            "required": ["answer"],
        },
    },
}

# The same tool with its arguments pinned to the schema: vLLM >= 0.32 constrains a forced
# call's arguments only for a `strict` tool (--tool-strict-level auto), earlier releases every
# forced call. The structure probe sends this one, and checks that the arguments conform.
STRICT_PROBE_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {**PROBE_TOOL["function"], "strict": True},
}

_SERVER_FIX = (
    "check the model server's log (runs/<run_id>/logs/): it may have died or be loading "
    "still; a GPU fault keeps /health at 200 — resubmit to get another node"
)


def _arm_file(arm: Arm) -> str:
    return f"arms/{arm.name}.toml"


_KEY_FIX = (
    "the model server must run with the key this run gives it (VLLM_API_KEY in its "
    "environment); a server started by hand (--haico-model-endpoint) needs the same "
    "VLLM_API_KEY as this run"
)

# Only a model server started elsewhere leaves a run without a key.
_NO_KEY_FIX = (
    "set HAICO_MODEL_API_KEY to the key the model server was started with (its VLLM_API_KEY)"
)


async def _models(
    client: httpx.AsyncClient, api_base: str, api_key: str, timeout_s: float
) -> list[dict[str, Any]] | GateResult:
    """The model cards of ``GET /models`` with the key, or the failure to report."""
    url = f"{api_base.rstrip('/')}/models"
    reply = await get(client, url, headers=bearer(api_key), timeout_s=timeout_s)
    if reply.status is None:
        return failed(SERVED_MODEL, f"GET {url}: {reply.describe()}", _SERVER_FIX)
    if reply.status == 401 and not api_key:
        why = (
            f"GET {url} without a key: {reply.describe()} (the server wants one; the run has none)"
        )
        return failed(SERVED_MODEL, why, _NO_KEY_FIX)
    if reply.status == 401:
        why = f"GET {url} with the run's key: {reply.describe()} (the server has another key)"
        return failed(SERVED_MODEL, why, _KEY_FIX)
    data = reply.body.get("data") if isinstance(reply.body, dict) else None
    if reply.status != 200 or not isinstance(data, list):
        return failed(SERVED_MODEL, f"GET {url}: {reply.describe()}, not a model list", _SERVER_FIX)
    return [card for card in data if isinstance(card, dict)]


async def check_served_model(
    client: httpx.AsyncClient, api_base: str, *, api_key: str, arm: Arm, timeout_s: float = 10.0
) -> GateResult:
    """The server serves the arm's ``served_name`` (``GET /models`` with the key)."""
    cards = await _models(client, api_base, api_key, timeout_s)
    if isinstance(cards, GateResult):
        return cards
    ids = [str(card.get("id")) for card in cards]
    if arm.served_name not in ids:
        return failed(
            SERVED_MODEL,
            f"the server serves {ids}, not {arm.served_name!r} (arm {arm.name})",
            f"set [model] served_name in {_arm_file(arm)} to the name the server serves, or "
            f"start the server with --served-model-name {arm.served_name}",
        )
    return passed(SERVED_MODEL, f"serves {arm.served_name!r}")


async def check_max_model_len(
    client: httpx.AsyncClient, api_base: str, *, api_key: str, arm: Arm, timeout_s: float = 10.0
) -> GateResult:
    """The served model's ``max_model_len`` is at least the arm's."""
    cards = await _models(client, api_base, api_key, timeout_s)
    if isinstance(cards, GateResult):
        return failed(MAX_MODEL_LEN, cards.detail, cards.fix)
    card = next((c for c in cards if c.get("id") == arm.served_name), None)
    if card is None:
        return failed(MAX_MODEL_LEN, f"no model card for {arm.served_name!r}", _SERVER_FIX)
    served = card.get("max_model_len")
    wanted = arm.vllm.max_model_len
    if not isinstance(served, int) or isinstance(served, bool):
        return passed(MAX_MODEL_LEN, "the server does not report max_model_len: not checked")
    if served < wanted:
        return failed(
            MAX_MODEL_LEN,
            f"the server's max_model_len is {served}, below the arm's {wanted}: long "
            "conversations would be refused",
            f"start vLLM with --max-model-len {wanted} ([vllm] max_model_len in "
            f"{_arm_file(arm)} is passed to it; if the GPUs cannot hold that context, lower "
            "max_model_len in the arm — a different experiment — or raise "
            "--gpu-memory-utilization in [vllm] extra_args)",
        )
    return passed(MAX_MODEL_LEN, f"max_model_len {served} >= {wanted}")


async def check_completion(
    client: httpx.AsyncClient,
    api_base: str,
    *,
    api_key: str,
    arm: Arm,
    attempts: int = GENERATION_ATTEMPTS,
    timeout_s: float = 60.0,
) -> GateResult:
    """A one-token completion answers 200 (``/health`` can stay 200 after a GPU fault)."""

    def body(attempt: int) -> dict[str, Any]:
        text = f"Reply with one word. (pytest-haico gate, attempt {attempt})"
        return {
            "model": arm.served_name,
            "messages": [{"role": "user", "content": text}],
            "max_tokens": 1,
            "temperature": 0.0,
            "stream": False,
        }

    url = f"{api_base.rstrip('/')}/chat/completions"
    reply = await post(
        client, url, headers=bearer(api_key), body_for=body, attempts=attempts, timeout_s=timeout_s
    )
    choices = reply.body.get("choices") if isinstance(reply.body, dict) else None
    if reply.status != 200 or not isinstance(choices, list) or not choices:
        return failed(COMPLETION, f"a one-token completion: {reply.describe()}", _SERVER_FIX)
    reason = choices[0].get("finish_reason") if isinstance(choices[0], dict) else None
    return passed(
        COMPLETION,
        f"one token in {reply.seconds:.2f} s (finish_reason {reason}){reply.retried_note()}",
    )


async def check_api_key_required(
    client: httpx.AsyncClient, api_base: str, *, timeout_s: float = 10.0
) -> GateResult:
    """``GET /models`` without the key answers 401: the key reached the server."""
    url = f"{api_base.rstrip('/')}/models"
    reply = await get(client, url, headers={}, timeout_s=timeout_s)
    if reply.status == 401:
        return passed(API_KEY, "GET /models without the key: HTTP 401")
    if reply.status is not None and 200 <= reply.status < 300:
        return failed(
            API_KEY,
            "the model server answers without a key: the run's VLLM_API_KEY never reached it, "
            "and every user of the node can use it",
            _KEY_FIX,
        )
    return failed(API_KEY, f"GET {url} without the key: {reply.describe()}", _SERVER_FIX)


def _tool_flags_fix(arm: Arm) -> str:
    parser = arm.vllm.tool_call_parser or "<parser>"
    return (
        f"set [vllm] enable_tool_calling = true and tool_call_parser = {parser!r} in "
        f"{_arm_file(arm)} (vLLM gets --enable-auto-tool-choice --tool-call-parser {parser}); "
        "a server started by hand needs those flags. Never run the arm without them: the "
        "backend's agent sends tools with tool_choice omitted ('auto'), so every turn would fail"
    )


async def check_tool_choice_auto(
    client: httpx.AsyncClient,
    api_base: str,
    *,
    api_key: str,
    arm: Arm,
    attempts: int = GENERATION_ATTEMPTS,
    timeout_s: float = 60.0,
) -> GateResult:
    """A request as the backend sends it (``tools`` present, ``tool_choice`` omitted, i.e.
    "auto") answers 200. vLLM <= 0.13 without the tool flags refuses only this one."""

    def body(attempt: int) -> dict[str, Any]:
        text = f"Say hello in one word. (pytest-haico gate, attempt {attempt})"
        return {
            "model": arm.served_name,
            "messages": [{"role": "user", "content": text}],
            "tools": [PROBE_TOOL],
            "max_tokens": 16,
            "temperature": 0.0,
            "stream": False,
        }

    url = f"{api_base.rstrip('/')}/chat/completions"
    reply = await post(
        client, url, headers=bearer(api_key), body_for=body, attempts=attempts, timeout_s=timeout_s
    )
    if reply.status == 200:
        return passed(
            TOOL_CHOICE_AUTO,
            f"tools with tool_choice omitted: HTTP 200 in {reply.seconds:.2f} s"
            f"{reply.retried_note()}",
        )
    if reply.status == 400 and any(flag in reply.message for flag in TOOL_FLAGS):
        return failed(
            TOOL_CHOICE_AUTO,
            f"the model server refuses tool calls as the backend sends them: {reply.describe()}",
            _tool_flags_fix(arm),
        )
    return failed(
        TOOL_CHOICE_AUTO, f"tools with tool_choice omitted: {reply.describe()}", _SERVER_FIX
    )


async def check_tool_call_structure(
    client: httpx.AsyncClient,
    api_base: str,
    *,
    api_key: str,
    arm: Arm,
    max_tokens: int = STRUCTURE_MAX_TOKENS,
    attempts: int = 3,
    timeout_s: float = 60.0,
) -> GateResult:
    """A named ``tool_choice`` of a strict tool gets a call of that tool whose arguments
    conform to its schema: ``finish_reason`` "stop" or "tool_calls", content "" or null. The
    server constrains those arguments (guided decoding), so a 200 with arguments that do not
    conform is its failure, not the model's. The first guided request compiles a grammar:
    hence the long timeout."""

    def body(attempt: int) -> dict[str, Any]:
        text = f'Call {PROBE_TOOL_NAME} with the answer "ok". (pytest-haico gate, {attempt})'
        return {
            "model": arm.served_name,
            "messages": [{"role": "user", "content": text}],
            "tools": [STRICT_PROBE_TOOL],
            "tool_choice": {"type": "function", "function": {"name": PROBE_TOOL_NAME}},
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "stream": False,
        }

    url = f"{api_base.rstrip('/')}/chat/completions"
    reply = await post(
        client, url, headers=bearer(api_key), body_for=body, attempts=attempts, timeout_s=timeout_s
    )
    named = f"a named tool_choice ({PROBE_TOOL_NAME})"
    if reply.status == 400 and any(flag in reply.message for flag in TOOL_FLAGS):
        return failed(TOOL_CALL_STRUCTURE, f"{named}: {reply.describe()}", _tool_flags_fix(arm))
    choices = reply.body.get("choices") if isinstance(reply.body, dict) else None
    if reply.status != 200 or not isinstance(choices, list) or not choices:
        return failed(TOOL_CALL_STRUCTURE, f"{named}: {reply.describe()}", _SERVER_FIX)
    problem = _structure_problem(choices[0], max_tokens)
    if problem is not None:
        return failed(
            TOOL_CALL_STRUCTURE,
            f"{named}: {problem}",
            "the server's guided decoding does not produce tool calls: check the vLLM version "
            "and its structured-output backend (VLLM_VENV, [vllm] extra_args)",
        )
    return passed(TOOL_CALL_STRUCTURE, f"{named}: a call of it, arguments conform")


def _structure_problem(choice: Any, max_tokens: int) -> str | None:
    """What is wrong with the choice, None if nothing."""
    if not isinstance(choice, dict) or not isinstance(choice.get("message"), dict):
        return "the answer has no message"
    message, reason = choice["message"], choice.get("finish_reason")
    if reason == "length":
        return f"truncated at max_tokens {max_tokens} (finish_reason 'length')"
    if reason not in ("stop", "tool_calls"):
        return f"finish_reason {reason!r}, expected 'stop' or 'tool_calls'"
    if message.get("content") not in ("", None):
        return f"content {str(message.get('content'))[:80]!r} next to the call, expected none"
    calls = message.get("tool_calls")
    first = calls[0] if isinstance(calls, list) and calls else None
    function = first.get("function") if isinstance(first, dict) else None
    if not isinstance(function, dict) or function.get("name") != PROBE_TOOL_NAME:
        return f"no call of {PROBE_TOOL_NAME} in tool_calls ({str(calls)[:120]})"
    if not _conforms(function.get("arguments")):
        arguments = str(function.get("arguments"))[:80]
        return f"arguments {arguments!r} do not conform to the strict tool's schema"
    return None


def _conforms(arguments: Any) -> bool:
    """The probe tool's schema: an object whose one required property `answer` is a string."""
    try:
        decoded = json.loads(arguments) if isinstance(arguments, str) else None
    except ValueError:
        return False
    return isinstance(decoded, dict) and isinstance(decoded.get("answer"), str)
