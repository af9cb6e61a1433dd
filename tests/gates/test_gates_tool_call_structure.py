"""The named-choice probe of a strict tool checks the call's structure and that its arguments
conform: shapes real vLLM answers with pass; a truncated, chatty or unconstrained answer fails,
although it came with a 200 (MockTransport)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from pytest_haico.config.experiment import Arm
from pytest_haico.gates.dynamic import PROBE_TOOL_NAME, check_tool_call_structure
from pytest_haico.gates.result import GateResult

ARM = Arm.model_validate({"name": "demo"})
FIX = (
    "the server's guided decoding does not produce tool calls: check the vLLM version and its "
    "structured-output backend (VLLM_VENV, [vllm] extra_args)"
)


def answer(
    *, content: str | None = "", reason: str = "stop", arguments: str = '{"answer": "ok"}'
) -> dict[str, Any]:
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": PROBE_TOOL_NAME, "arguments": arguments},
    }
    message = {"role": "assistant", "content": content, "tool_calls": [call]}
    return {"choices": [{"index": 0, "message": message, "finish_reason": reason}]}


async def probe(body: dict[str, Any]) -> tuple[GateResult, dict[str, Any]]:
    sent: dict[str, Any] = {}

    def handler(request: httpx.Request) -> httpx.Response:
        sent.update(json.loads(request.content))
        return httpx.Response(200, json=body)

    transport = httpx.MockTransport(handler)
    async with httpx.AsyncClient(transport=transport, trust_env=False) as client:
        result = await check_tool_call_structure(client, "http://x/v1", api_key="k", arm=ARM)
    return result, sent


@pytest.mark.asyncio
async def test_the_probe_is_a_non_streamed_named_choice_with_room_for_the_arguments() -> None:
    _, sent = await probe(answer())
    assert sent["tool_choice"] == {"type": "function", "function": {"name": PROBE_TOOL_NAME}}
    assert [tool["function"]["name"] for tool in sent["tools"]] == [PROBE_TOOL_NAME]
    assert [tool["function"]["strict"] for tool in sent["tools"]] == [True]
    assert (sent["max_tokens"], sent["stream"], sent["model"]) == (256, False, "demo")


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("body", "detail"),
    [
        # vLLM non-streaming: content "", finish_reason "stop".
        (answer(), "a call of it, arguments conform"),
        (answer(content=None, reason="tool_calls"), "a call of it, arguments conform"),
    ],
)
async def test_a_call_of_the_named_tool_with_conforming_arguments_passes(
    body: dict[str, Any], detail: str
) -> None:
    result, _ = await probe(body)
    assert (result.passed, result.detail) == (
        True,
        f"a named tool_choice ({PROBE_TOOL_NAME}): {detail}",
    )


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("body", "problem"),
    [
        (answer(reason="length"), "truncated at max_tokens 256 (finish_reason 'length')"),
        (
            answer(content="Sure! Calling it."),
            "content 'Sure! Calling it.' next to the call, expected none",
        ),
        (
            {"choices": [{"message": {"content": ""}, "finish_reason": "stop"}]},
            f"no call of {PROBE_TOOL_NAME} in tool_calls (None)",
        ),
        # A 200 whose arguments nothing constrained (vLLM >= 0.12 answers the old guided_*
        # fields so): the server's failure, not the model's.
        (
            answer(arguments='{"answer": 3}'),
            "arguments '{\"answer\": 3}' do not conform to the strict tool's schema",
        ),
        (
            answer(arguments="Paris"),
            "arguments 'Paris' do not conform to the strict tool's schema",
        ),
    ],
)
async def test_a_truncated_chatty_missing_or_unconstrained_call_fails(
    body: dict[str, Any], problem: str
) -> None:
    result, _ = await probe(body)
    assert result.failure_line == (
        f"gate tool_call_structure failed: a named tool_choice ({PROBE_TOOL_NAME}): {problem}; "
        f"{FIX}"
    )
