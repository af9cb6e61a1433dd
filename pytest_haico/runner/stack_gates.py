"""An arm's dynamic gates, against its running stack: the model server's probes, the
backend's health, and a canary turn through the backend (last)."""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import replace
from functools import partial
from pathlib import Path

import httpx

from pytest_haico.config.experiment import Arm, Script
from pytest_haico.driver.conversation import ConversationSetup, run_conversation
from pytest_haico.driver.transcripts import transcript_header
from pytest_haico.errors import InfraError
from pytest_haico.gates import backend as backend_gates
from pytest_haico.gates import dynamic
from pytest_haico.gates.result import AsyncGate, GateResult
from pytest_haico.ledger.verdicts import Verdict
from pytest_haico.runner.stack_life import RunStack

# The canary turn: enough steps for a tool call and an answer (a looping model ends at the
# limit, which is no failure of the canary), and a bound of its own on the turn.
CANARY_RECURSION_LIMIT = 4
CANARY_TURN_TIMEOUT_S = 60.0


def dynamic_gates(
    client: httpx.AsyncClient, stack: RunStack, arm: Arm, canary: backend_gates.Canary
) -> list[AsyncGate]:
    """The dynamic gates of a running stack, in DESIGN's order."""
    # The model server's OpenAI base as this process reaches it (an attached endpoint's
    # too: `llm_url` is its base without /v1).
    api_base = f"{stack.llm_url}/v1"
    keyed: dict[str, object] = {"api_key": stack.api_key, "arm": arm}
    model: list[tuple[str, Callable[..., Awaitable[GateResult]], dict[str, object]]] = [
        (dynamic.SERVED_MODEL, dynamic.check_served_model, keyed),
        (dynamic.MAX_MODEL_LEN, dynamic.check_max_model_len, keyed),
        (dynamic.COMPLETION, dynamic.check_completion, keyed),
        (dynamic.API_KEY, dynamic.check_api_key_required, {}),
        (dynamic.TOOL_CHOICE_AUTO, dynamic.check_tool_choice_auto, keyed),
        (dynamic.TOOL_CALL_STRUCTURE, dynamic.check_tool_call_structure, keyed),
    ]
    health = partial(
        backend_gates.check_backend_health, client, stack.backend_url, token=stack.admin_token
    )
    return [
        *(
            AsyncGate(name, partial(check, client, api_base, **options))
            for name, check, options in model
        ),
        AsyncGate(backend_gates.BACKEND_HEALTH, health),
        AsyncGate(
            backend_gates.CANARY_TURN, partial(backend_gates.check_canary_turn, canary, arm=arm)
        ),
    ]


def make_canary(
    client: httpx.AsyncClient, setup: ConversationSetup, *, transcripts: Path
) -> backend_gates.Canary:
    """One scripted turn through the backend of `setup`, a new query and thread each call,
    with the canary's own bounds and no judge; its transcript is
    `<transcripts>/canary.<n>.jsonl`. Returns (provider, model_id) of the turn's snapshot
    row; raises when the turn failed on infrastructure."""
    calls = itertools.count(1)
    arm = setup.arm
    agent = arm.agent.model_copy(
        update={"recursion_limit": min(arm.agent.recursion_limit, CANARY_RECURSION_LIMIT)}
    )
    canary_setup = replace(
        setup,
        arm=arm.model_copy(update={"agent": agent}),
        turn_timeout_s=CANARY_TURN_TIMEOUT_S,
        judge=None,
    )

    async def canary() -> tuple[str | None, str | None]:
        call = next(calls)
        script = Script.model_validate(
            {"id": "haico-canary", "turns": [{"user": f"Canary {call}: reply with one word."}]}
        )
        thread_id = str(uuid.uuid4())
        result = await run_conversation(
            client,
            canary_setup,
            script=script,
            thread_id=thread_id,
            transcript_path=transcripts / f"canary.{call}.jsonl",
            transcript_header=transcript_header(canary=call, arm=arm.name, thread_id=thread_id),
        )
        if result.verdict in (Verdict.INFRA_ERROR, Verdict.RATE_LIMITED):
            raise InfraError(result.error.message if result.error else result.verdict.value)
        turn = result.turns[0]
        return turn.provider, turn.model_id

    return canary
