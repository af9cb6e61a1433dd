"""How the driver reads the SSE stream: chunk boundaries, multi-line data, comments, cuts."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from pytest_haico.driver import conversation as driver
from pytest_haico.ledger.verdicts import Verdict
from tests.driver.driver_fakes import (
    Converse,
    FakeBackend,
    Reply,
    answer,
    complete,
    make_script,
    sse,
    step,
    tool_call,
)

pytestmark = pytest.mark.asyncio

# A whole turn as one byte string: non-ASCII text (multi-byte UTF-8), a tool
# call, a comment, an id line and CRLF line ends in the middle.
STREAM = b"".join(
    [
        b": connected\n\n",
        step("", tool_calls=[tool_call()]),
        b"id: 7\r\n" + step("Chania → Heraklion, 🏖").replace(b"\n", b"\r\n"),
        b": keep-alive\n\n",
        complete(tokens=(11, 22)),
    ]
)


async def test_stream_delivered_one_byte_at_a_time_completes(converse: Converse) -> None:
    chunks = [STREAM[i : i + 1] for i in range(len(STREAM))]
    done = await converse(FakeBackend(chunks))
    assert done.result.verdict is Verdict.COMPLETED
    turn = done.result.turns[0]
    assert (turn.steps, turn.tool_calls, turn.tokens_in, turn.tokens_out) == (2, 1, 11, 22)
    events = [line["data"] for line in done.lines if line["kind"] == "event"]
    contents = [event["step"]["content"] for event in events if event["type"] == "step"]
    assert contents == ["", "Chania → Heraklion, 🏖"]


async def test_event_split_across_chunks_mid_json(converse: Converse) -> None:
    event = step("The plan.")
    chunks = [event[:9], event[9:30], event[30:-1], event[-1:], complete()]
    done = await converse(FakeBackend(chunks))
    assert done.result.verdict is Verdict.COMPLETED
    assert done.result.turns[0].steps == 1


async def test_multi_line_data_is_joined_into_one_event(converse: Converse) -> None:
    body = (
        b'data: {"type": "step",\n'
        b'data:  "step": {"content": "line one\\nline two", "tool_calls": []}}\n'
        b"\n"
    )
    done = await converse(FakeBackend([body, complete()]))
    assert done.result.verdict is Verdict.COMPLETED
    (event, _complete) = [line for line in done.lines if line["kind"] == "event"]
    assert event["data"]["step"]["content"] == "line one\nline two"


async def test_comments_and_other_fields_are_ignored(converse: Converse) -> None:
    body = (
        b": ping\n\n"
        b"retry: 3000\n"
        b"event: step\n"
        b"id: 1\n"
        + step("Answer.")
        # Blank lines without data dispatch nothing (the id does not make an event).
        + b"\n\n: ping\n\n"
    )
    done = await converse(FakeBackend([body, complete()]))
    assert done.result.verdict is Verdict.COMPLETED
    assert done.result.turns[0].steps == 1
    assert [line["kind"] for line in done.lines].count("event") == 2


async def test_unknown_fields_and_event_types_are_tolerated(converse: Converse) -> None:
    body = [
        sse({"type": "heartbeat", "seq": 1}),
        sse(
            {
                "type": "step",
                "new_field": [1, 2],
                "step": {"content": [{"type": "text", "text": "Answer."}], "tokens": 3},
            }
        ),
        sse({"type": "complete", "recursion_limit_reached": False, "usage": None, "x": 1}),
    ]
    done = await converse(FakeBackend(body))
    assert done.result.verdict is Verdict.COMPLETED
    assert done.result.turns[0].tokens_in is None


@pytest.mark.parametrize(
    "tail",
    [
        pytest.param(b'data: {"type": "complete", "recursion_lim', id="mid-json"),
        pytest.param(complete()[:-1], id="complete-without-blank-line"),
        pytest.param(b"", id="no-terminal-event"),
    ],
)
async def test_stream_cut_before_a_terminal_event_is_infra_error(
    converse: Converse, tail: bytes
) -> None:
    backend = FakeBackend([step("partial"), tail], answer())
    done = await converse(backend, make_script("a", "b"))
    assert done.result.verdict is Verdict.INFRA_ERROR
    assert done.result.error is not None
    assert done.result.error.kind == "broken_stream"
    assert done.result.turns[0].steps == 1
    assert len(backend.requests) == 1


async def test_connection_dropped_mid_stream_is_infra_error(converse: Converse) -> None:
    failure = httpx.RemoteProtocolError("peer closed connection without sending complete body")
    done = await converse(FakeBackend(Reply(chunks=[step("partial")], fail=failure)))
    assert done.result.verdict is Verdict.INFRA_ERROR
    assert done.result.error is not None
    assert done.result.error.kind == "broken_stream"
    assert "peer closed" in done.result.error.message


@pytest.mark.parametrize(
    ("body", "content_type"),
    [
        pytest.param([b"data: not json\n\n"], "text/event-stream", id="data-not-json"),
        pytest.param([sse({"type": "step", "step": "text"})], "text/event-stream", id="bad-step"),
        pytest.param([b'{"answer": 1}'], "application/json", id="not-an-event-stream"),
    ],
)
async def test_protocol_violation_is_infra_error(
    converse: Converse, body: list[bytes], content_type: str
) -> None:
    done = await converse(FakeBackend(Reply(chunks=body, content_type=content_type)))
    assert done.result.verdict is Verdict.INFRA_ERROR
    assert done.result.error is not None
    assert done.result.error.kind == "protocol"


async def test_the_stream_is_read_to_its_end_after_the_terminal_event(converse: Converse) -> None:
    # Read to its end, the response gives its connection back to the client's
    # pool; closed early, the connection is dropped and the next turn opens one.
    late = Reply(chunks=[*answer(), step("after the end"), b": bye\n\n"])
    done = await converse(FakeBackend(late, answer()), make_script("a", "b"))
    assert done.result.verdict is Verdict.COMPLETED
    assert late.sent.is_set()
    assert done.result.turns[0].steps == 1
    assert "after the end" not in done.transcript.read_text()


async def test_a_failure_after_the_terminal_event_does_not_fail_the_turn(
    converse: Converse,
) -> None:
    failure = httpx.RemoteProtocolError("peer closed connection without sending complete body")
    backend = FakeBackend(Reply(chunks=answer(), fail=failure), answer())
    done = await converse(backend, make_script("a", "b"))
    assert done.result.verdict is Verdict.COMPLETED
    assert len(done.backend.requests) == 2


async def test_a_stream_kept_open_after_the_terminal_event_costs_only_the_grace(
    converse: Converse, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(driver, "_DRAIN_GRACE_S", 0.5)
    backend = FakeBackend(Reply(chunks=answer(), hang=True), answer())
    # An hour's turn timeout: the turn ends once the grace is over, never at the timeout.
    done = await asyncio.wait_for(
        converse(backend, make_script("a", "b"), turn_timeout_s=3600.0), timeout=60
    )
    assert done.result.verdict is Verdict.COMPLETED
    assert len(backend.requests) == 2
    # The latency ends at the terminal event, not when the connection was given up a
    # grace later (and the conversation went on after that).
    first = done.result.turns[0]
    assert first.latency_s is not None
    assert first.latency_s + 0.5 <= done.result.duration_s
