"""The wire module: request body, typed events, tolerance for unknown fields."""

from __future__ import annotations

from typing import Any

import pytest

from pytest_haico.driver import wire
from pytest_haico.errors import WireError
from tests.driver.driver_fakes import make_arm, make_script


def test_query_body_names_the_arm_and_the_branch() -> None:
    script = make_script("a", {"user": "Fork here.", "branch_from": 0})
    body = wire.build_query_body(
        make_arm(recursion_limit=7),
        script.turns[1],
        thread_id="t-1",
        branch_from_turn=0,
        endpoint_url="http://vllm.localhost:1/v1",
    )
    assert body["query"] == "Fork here."
    assert (body["thread_id"], body["branch_from_turn"]) == ("t-1", 0)
    assert body["config"]["model"]["API"] == "openai"
    assert body["config"]["agent"] == {"recursion_limit": 7}


def test_stream_url_and_headers() -> None:
    assert wire.stream_url("http://h:1/") == "http://h:1/api/query/stream_steps/sse"
    assert wire.build_headers("t") == {
        "Authorization": "Bearer t",
        "Accept": "text/event-stream",
        "Cache-Control": "no-store",
    }


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        ({"type": "step", "step": {"content": "x"}}, wire.StepEvent),
        ({"type": "complete"}, wire.CompleteEvent),
        ({"type": "error", "kind": "auth", "error": "no"}, wire.ErrorEvent),
        ({"type": "progress", "pct": 50}, wire.OtherEvent),
    ],
)
def test_parse_event_by_type(payload: dict[str, Any], expected: type[Any]) -> None:
    assert type(wire.parse_event(payload)) is expected


def test_unknown_fields_are_ignored_and_nulls_defaulted() -> None:
    event = wire.parse_event(
        {
            "type": "step",
            "thread_id": "t",
            "turn_index": 2,
            "extra": {"nested": True},
            "step": {"content": None, "tool_calls": None, "surprise": 1},
        }
    )
    assert isinstance(event, wire.StepEvent)
    assert (event.thread_id, event.turn_index, event.step.tool_calls) == ("t", 2, [])
    assert event.step.text == ""
    complete = wire.parse_event({"type": "complete", "usage": None})
    assert isinstance(complete, wire.CompleteEvent)
    assert complete.usage.tokens_in is None and not complete.recursion_limit_reached


def test_step_text_flattens_content_blocks() -> None:
    step = wire.Step(content=[{"type": "text", "text": "a"}, "b", {"type": "image"}])
    assert step.text == "ab"


def test_canned_reply_needs_no_tool_calls() -> None:
    assert wire.Step(content=f"  {wire.CANNED_RECURSION_REPLY}\n").is_canned_recursion_reply
    looping = wire.Step(content=wire.CANNED_RECURSION_REPLY, tool_calls=[{"name": "x"}])
    assert not looping.is_canned_recursion_reply


def test_error_kind_and_message_are_tolerant() -> None:
    event = wire.parse_event({"type": "error", "kind": "recursion_limit", "error": {"n": 25}})
    assert isinstance(event, wire.ErrorEvent)
    assert event.is_recursion_limit and event.error == '{"n": 25}'


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        ("not json", "not JSON"),
        ("[1, 2]", "not a JSON object"),
    ],
)
def test_parse_payload_refuses_non_objects(data: str, problem: str) -> None:
    with pytest.raises(WireError, match=problem):
        wire.parse_payload(data)


@pytest.mark.parametrize(
    ("payload", "problem"),
    [
        ({"step": {}}, "without a string 'type'"),
        ({"type": "step"}, r"malformed 'step' event: step: Field required"),
        ({"type": "complete", "turn_index": "x"}, r"malformed 'complete' event: turn_index"),
    ],
)
def test_malformed_known_events_are_wire_errors(payload: dict[str, Any], problem: str) -> None:
    with pytest.raises(WireError, match=problem):
        wire.parse_event(payload)
