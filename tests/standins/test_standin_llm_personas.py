"""Each persona of the stand-in vLLM behaves as the arm file says, reproducibly from its seed."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from pytest_haico.standins.agent import WriteDocumentArgs
from pytest_haico.standins.openai_wire import ChatRequest
from pytest_haico.standins.personas import SLOW_EXTRA_MS, Hang, Persona, plan_completion
from tests.polling import wait_for
from tests.standins.standin_http import (
    TOOLS,
    PlaceOrder,
    chat,
    get,
    message_of,
    sse_data,
    tool_arguments,
    user,
)
from tests.standins.standin_procs import LlmServer, LlmServers

# The personas that answer; persona dead answers once, then its server is gone.
PERSONAS = [p.value for p in Persona if p is not Persona.DEAD]
ARTIFACT_TURN = user("Please write a report about Crete.")
QUESTION = user("What is the capital of Crete?")
NAMED = {"type": "function", "function": {"name": "place_order"}}


@pytest.fixture(scope="module", autouse=True)
def _persona_servers(llm_server: LlmServers) -> None:
    """Start every persona's server at once, so their start-ups overlap."""
    llm_server.prefetch([(p, {}) for p in PERSONAS])


def after_tool_result(call_message: dict[str, Any]) -> list[dict[str, Any]]:
    """The conversation after the model's tool call got its result."""
    (call,) = call_message["tool_calls"]
    result = {"role": "tool", "tool_call_id": call["id"], "content": "Wrote the document."}
    return [*ARTIFACT_TURN, call_message, result]


def test_helpful_answers_a_question_in_text(llm_server: LlmServers) -> None:
    message = message_of(chat(llm_server("helpful").base_url, QUESTION, tools=TOOLS))
    assert message["content"]
    assert not message.get("tool_calls")


def test_helpful_calls_a_tool_for_an_artifact_then_answers(llm_server: LlmServers) -> None:
    base_url = llm_server("helpful").base_url
    call = message_of(chat(base_url, ARTIFACT_TURN, tools=TOOLS))
    assert call["tool_calls"][0]["function"]["name"] == "write_document"
    WriteDocumentArgs.model_validate(tool_arguments(call))
    answer = message_of(chat(base_url, after_tool_result(call), tools=TOOLS))
    assert answer["content"]
    assert not answer.get("tool_calls")


def test_tool_choice_none_gets_text_even_for_an_artifact(llm_server: LlmServers) -> None:
    response = chat(llm_server("helpful").base_url, ARTIFACT_TURN, tools=TOOLS, tool_choice="none")
    message = message_of(response)
    assert message["content"]
    assert not message.get("tool_calls")


def test_looper_calls_a_tool_on_every_completion(llm_server: LlmServers) -> None:
    base_url = llm_server("looper").base_url
    first = message_of(chat(base_url, QUESTION, tools=TOOLS))
    assert first["tool_calls"]
    again = message_of(chat(base_url, after_tool_result(first), tools=TOOLS))
    assert again["tool_calls"]
    assert message_of(chat(base_url, QUESTION))["content"], "without tools it can only answer"


def test_bad_args_calls_fail_the_tool_schema(llm_server: LlmServers) -> None:
    message = message_of(chat(llm_server("bad_args").base_url, QUESTION, tools=TOOLS))
    arguments = tool_arguments(message)
    assert "action_and_reasoning" not in arguments
    with pytest.raises(ValidationError, match="action_and_reasoning"):
        WriteDocumentArgs.model_validate(arguments)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_blank_returns_empty_content_and_no_tool_call(llm_server: LlmServers, stream: bool) -> None:
    response = chat(llm_server("blank").base_url, ARTIFACT_TURN, tools=TOOLS, stream=stream)
    assert response.status_code == 200
    if stream:
        chunks = [json.loads(p) for p in sse_data(response.text)[:-1]]
        deltas = [c["choices"][0]["delta"] for c in chunks]
        assert "".join(d.get("content", "") for d in deltas) == ""
        assert not any("tool_calls" in d for d in deltas)
        assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    else:
        choice = response.json()["choices"][0]
        assert choice["message"]["content"] == ""
        assert "tool_calls" not in choice["message"]
        assert choice["finish_reason"] == "stop"


def flaky_pattern(base_url: str) -> list[int]:
    """Status codes for thirty different conversations."""
    return [chat(base_url, user(f"question {i}")).status_code for i in range(30)]


def test_flaky_fails_about_half_the_requests_with_500(llm_server: LlmServers) -> None:
    base_url = llm_server("flaky").base_url
    pattern = flaky_pattern(base_url)
    assert set(pattern) == {200, 500}
    assert 7 <= pattern.count(500) <= 23
    failing = pattern.index(500)
    error = chat(base_url, user(f"question {failing}")).json()["error"]
    assert error["code"] == 500
    assert error["type"] == "InternalServerError"


def test_flaky_fails_the_same_conversations_for_the_same_seed(llm_server: LlmServers) -> None:
    first, twin, other = llm_server.prefetch(
        [("flaky", {}), ("flaky", {"replica": 1}), ("flaky", {"seed": 1})]
    )
    pattern = flaky_pattern(first.base_url)
    assert flaky_pattern(first.base_url) == pattern, "repeated requests must fail alike"
    assert flaky_pattern(twin.base_url) == pattern, "another process with the seed must agree"
    assert flaky_pattern(other.base_url) != pattern, "another seed must fail others"


def test_slow_adds_latency(llm_server: LlmServers) -> None:
    started = time.monotonic()
    message_of(chat(llm_server("slow").base_url, QUESTION))
    assert time.monotonic() - started >= SLOW_EXTRA_MS / 1000


def test_latency_ms_delays_every_completion(llm_server: LlmServers) -> None:
    base_url = llm_server("helpful", latency_ms=300).base_url
    variants: list[dict[str, Any]] = [{}, {"tools": TOOLS, "tool_choice": NAMED}]
    for fields in variants:
        started = time.monotonic()
        message_of(chat(base_url, QUESTION, **fields))
        assert time.monotonic() - started >= 0.3


def test_hang_answers_a_first_request_then_holds_the_conversation_and_stays_healthy(
    llm_server: LlmServers,
) -> None:
    base_url = llm_server("hang").base_url
    # A conversation's first request is answered as helpful answers it: in text, or with
    # a tool call when the turn asks for an artifact.
    assert message_of(chat(base_url, QUESTION, tools=TOOLS))["content"]
    call = message_of(chat(base_url, ARTIFACT_TURN, tools=TOOLS))
    assert call["tool_calls"][0]["function"]["name"] == "write_document"
    # Once the model has spoken in it, the conversation hangs: after the tool's result,
    # and after its own answer.
    answered = [*QUESTION, {"role": "assistant", "content": "Heraklion."}, *user("And Rhodes?")]
    for messages in (after_tool_result(call), answered):
        with pytest.raises(httpx.ReadTimeout):
            chat(base_url, messages, tools=TOOLS, timeout=httpx.Timeout(5.0, read=0.5))
    assert get(base_url + "/health").status_code == 200


@pytest.mark.parametrize(
    ("roles", "held"),
    [
        (["user"], False),
        (["system", "user"], False),
        (["user", "assistant", "user"], True),
        (["system", "user", "assistant", "tool"], True),
    ],
    ids=["first", "system-first", "second-turn", "after-a-tool"],
)
def test_hang_decides_from_the_messages_alone(roles: list[str], held: bool) -> None:
    messages = [{"role": role, "content": f"a {role} message"} for role in roles]
    request = ChatRequest.model_validate({"messages": messages, "tools": TOOLS})
    plans = [
        plan_completion(request, persona=Persona.HANG, seed=seed, latency_ms=0) for seed in range(3)
    ]
    assert [isinstance(plan.outcome, Hang) for plan in plans] == [held] * 3


@pytest.mark.parametrize("persona", PERSONAS)
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_a_named_tool_choice_always_gets_a_valid_call(
    llm_server: LlmServers, persona: str, stream: bool
) -> None:
    base_url = llm_server(persona).base_url
    # Several conversations for flaky: none of them may fail.
    for index in range(6 if persona == "flaky" else 1):
        messages = user(f"hi {index}")
        response = chat(base_url, messages, tools=TOOLS, tool_choice=NAMED, stream=stream)
        assert response.status_code == 200, response.text
        if stream:
            chunks = [json.loads(p) for p in sse_data(response.text)[:-1]]
            calls = [
                c["choices"][0]["delta"]["tool_calls"][0]
                for c in chunks
                if "tool_calls" in c["choices"][0]["delta"]
            ]
            assert calls[0]["function"]["name"] == "place_order"
            arguments = "".join(c["function"]["arguments"] for c in calls)
        else:
            message = message_of(response)
            assert message["tool_calls"][0]["function"]["name"] == "place_order"
            arguments = message["tool_calls"][0]["function"]["arguments"]
        PlaceOrder.model_validate_json(arguments)


@pytest.mark.parametrize("persona", PERSONAS)
def test_tool_choice_required_always_gets_a_valid_call(
    llm_server: LlmServers, persona: str
) -> None:
    response = chat(llm_server(persona).base_url, QUESTION, tools=TOOLS, tool_choice="required")
    WriteDocumentArgs.model_validate(tool_arguments(message_of(response)))


def wait_for_exit(server: LlmServer, *, timeout: float = 10.0) -> int:
    """The exit status of *server*'s process, once it has exited by itself."""
    wait_for(
        lambda: server.process.exit_status() is not None,
        timeout=timeout,
        what=f"{server.process.service.name} to exit",
    )
    status = server.process.exit_status()
    assert status is not None
    return status


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_dead_answers_500_with_an_empty_body_then_exits(
    llm_server: LlmServers, stream: bool
) -> None:
    server = llm_server("dead", replica=1 + stream)  # each test kills its own
    assert get(server.base_url + "/health").status_code == 200
    response = chat(server.base_url, QUESTION, tools=TOOLS, stream=stream)
    assert response.status_code == 500
    assert response.content == b""
    # As vLLM's server does after its engine died: a graceful shutdown, exit status 0.
    assert wait_for_exit(server) == 0
    assert "the engine died" in server.process.log_path.read_text()
    with pytest.raises(httpx.ConnectError):
        get(server.base_url + "/health")


def test_dead_fails_a_named_tool_choice_too(llm_server: LlmServers) -> None:
    server = llm_server("dead", replica=3)
    response = chat(server.base_url, QUESTION, tools=TOOLS, tool_choice=NAMED)
    assert (response.status_code, response.content) == (500, b"")
    assert wait_for_exit(server) == 0


def test_dead_still_refuses_a_bad_request_first(llm_server: LlmServers) -> None:
    server = llm_server("dead", replica=4)
    assert chat(server.base_url, QUESTION, model="other").status_code == 404
    assert server.process.exit_status() is None
    assert chat(server.base_url, QUESTION).status_code == 500
    assert wait_for_exit(server) == 0


def test_judge_answers_yes_when_the_answer_has_what_the_question_quotes(
    llm_server: LlmServers,
) -> None:
    base_url = llm_server("judge").base_url
    prompt = 'Does it mention "Crete" and "three days"?\n\nThe user wrote:\nPlan it.\n\n'
    yes = message_of(chat(base_url, user(prompt + "Three days on Crete.")))
    no = message_of(chat(base_url, user(prompt + "Crete, in a week.")))
    assert (yes["content"], no["content"]) == ("Yes.", "No.")
    assert not yes.get("tool_calls")


@pytest.mark.parametrize("persona", [Persona.HELPFUL, Persona.LOOPER, Persona.BAD_ARGS])
def test_blank_on_answers_blank_in_the_conversations_it_matches_whatever_the_persona(
    persona: Persona,
) -> None:
    import re

    from pytest_haico.standins.openai_wire import Reply

    pattern = re.compile(r"\bhard\b")
    matching = [{"role": "user", "content": "A hard one: write it up as a document."}]
    later = [*matching, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "more"}]
    other = [{"role": "user", "content": "An easy one: write it up as a document."}]
    for messages, blank in ((matching, True), (later, True), (other, False)):
        request = ChatRequest.model_validate({"messages": messages, "tools": TOOLS})
        plan = plan_completion(request, persona=persona, seed=0, latency_ms=0, blank_on=pattern)
        assert (plan.outcome == Reply("")) is blank
    named = ChatRequest.model_validate({"messages": matching, "tools": TOOLS, "tool_choice": NAMED})
    guided = plan_completion(named, persona=persona, seed=0, latency_ms=0, blank_on=pattern)
    assert isinstance(guided.outcome, Reply) and guided.outcome.tool_calls  # guided: valid call
