"""A conversation as a whole: branches, the transcript, cancellation, thread ids."""

from __future__ import annotations

import asyncio
from datetime import datetime
from pathlib import Path

import pytest

from pytest_haico.driver.conversation import ConversationProgress, make_thread_id
from pytest_haico.ledger.verdicts import Verdict
from tests.driver.driver_fakes import (
    TOKEN,
    Converse,
    FakeBackend,
    Reply,
    answer,
    make_script,
    step,
)


@pytest.mark.asyncio
async def test_branch_turn_sends_branch_from_turn_and_follows_the_new_thread(
    converse: Converse,
) -> None:
    script = make_script(
        "Plan a trip.",
        "Add a museum.",
        {"user": "Instead, plan it for a family.", "branch_from": 0},
        "Add a beach day.",
        {"user": "Instead, make it cheaper.", "branch_from": 3},
    )
    backend = FakeBackend(
        answer(thread_id="thread-0", turn_index=0),
        answer(thread_id="thread-0", turn_index=1),
        answer(thread_id="fork-1", turn_index=1),  # the branch is answered on a new thread
        answer(thread_id="fork-1", turn_index=2),
        answer(thread_id="fork-2", turn_index=3),
    )
    done = await converse(backend, script)
    assert done.result.verdict is Verdict.COMPLETED
    sent = [(body["thread_id"], body["branch_from_turn"]) for body in backend.bodies]
    # Turn 4 branches from turn 3, which the backend ran on fork-1 as its turn 2.
    assert sent == [("thread-0", None), ("thread-0", None), ("thread-0", 0), ("fork-1", None),
                    ("fork-1", 2)]  # fmt: skip
    turns = done.result.turns
    assert [t.thread_id for t in turns] == ["thread-0", "thread-0", "fork-1", "fork-1", "fork-2"]
    assert [t.branch_from for t in turns] == [None, None, 0, None, 3]
    assert done.snapshots.reads == [
        ("thread-0", 0),
        ("thread-0", 1),
        ("fork-1", 1),
        ("fork-1", 2),
        ("fork-2", 3),
    ]


@pytest.mark.asyncio
async def test_branch_on_a_backend_without_thread_ids_uses_the_script_indices(
    converse: Converse,
) -> None:
    script = make_script("a", "b", {"user": "c", "branch_from": 1})
    backend = FakeBackend(answer(), answer(), answer())
    done = await converse(backend, script)
    assert done.result.verdict is Verdict.COMPLETED
    sent = [(body["thread_id"], body["branch_from_turn"]) for body in backend.bodies]
    assert sent == [("thread-0", None), ("thread-0", None), ("thread-0", 1)]


@pytest.mark.asyncio
async def test_transcript_has_every_event_with_receive_time_and_turn(converse: Converse) -> None:
    done = await converse(FakeBackend(answer("one"), answer("two")), make_script("a", "b"))
    lines = done.lines
    kinds = ["request", "response", "event", "event", "snapshot"]
    assert [line["kind"] for line in lines] == kinds * 2
    assert [line["turn"] for line in lines] == [0] * 5 + [1] * 5
    for line in lines:
        assert datetime.fromisoformat(line["at"]).utcoffset() is not None
    events = [line for line in lines if line["kind"] == "event"]
    assert [event["data"]["type"] for event in events] == ["step", "complete"] * 2
    assert all(event["elapsed_s"] >= 0 for event in events)
    assert lines[0]["body"]["query"] == "a"
    assert lines[4]["snapshot"]["model_id"] == "qwen32b"


@pytest.mark.asyncio
async def test_transcript_and_error_never_contain_the_token(converse: Converse) -> None:
    leaky = Reply(
        chunks=[f'{{"detail": "bad token {TOKEN}", "auth": "Bearer {TOKEN}"}}'.encode()],
        status=401,
        content_type="application/json",
    )
    backend = FakeBackend(answer(f"your token is {TOKEN}"), leaky)
    done = await converse(backend, make_script("a", "b"))
    assert done.result.verdict is Verdict.INFRA_ERROR
    text = done.transcript.read_text()
    assert TOKEN not in text
    assert text.count("[REDACTED]") >= 1
    assert done.result.error is not None
    assert TOKEN not in done.result.error.message
    assert "HTTP 401" in done.result.error.message
    assert done.lines[-1]["kind"] == "finding"


@pytest.mark.asyncio
async def test_unparseable_event_is_kept_raw_in_the_transcript(converse: Converse) -> None:
    done = await converse(FakeBackend([b"data: {oops\n\n"]))
    assert done.result.verdict is Verdict.INFRA_ERROR
    assert {"kind": "event", "raw": "{oops"}.items() <= done.lines[2].items()


@pytest.mark.asyncio
async def test_unwritable_transcript_is_infra_error(converse: Converse, tmp_path: Path) -> None:
    (tmp_path / "transcripts").write_text("a file where the directory should be")
    done = await converse(FakeBackend(answer()))
    assert done.result.verdict is Verdict.INFRA_ERROR
    assert done.result.error is not None
    assert done.result.error.kind == "transcript"


@pytest.mark.asyncio
async def test_cancellation_mid_turn_closes_the_transcript_and_propagates(
    converse: Converse, tmp_path: Path
) -> None:
    in_flight = Reply(chunks=[step("thinking")], hang=True)
    backend = FakeBackend(answer(), in_flight, answer())
    progress = ConversationProgress()
    task = asyncio.create_task(
        converse(backend, make_script("a", "b", "c"), progress=progress, turn_timeout_s=30)
    )
    await in_flight.sent.wait()  # the turn's first step has been read
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    transcript = tmp_path / "transcripts" / "item.run.1.jsonl"
    lines = transcript.read_text().splitlines()
    assert '"kind":"cancelled"' in lines[-1]
    assert len(backend.requests) == 2

    result = progress.interrupted_result()
    assert result.verdict is Verdict.INTERRUPTED
    assert result.error is not None
    assert result.error.message == "during turn 2"
    assert [turn.index for turn in result.turns] == [0, 1]
    assert progress.turns == result.turns[:1]
    partial = result.turns[1]
    assert (partial.steps, partial.latency_s, partial.snapshot_id) == (1, None, None)


def test_thread_ids_are_unique_per_attempt_and_stable() -> None:
    first = make_thread_id("a" * 64, "local-20250101T000000Z-1.0", 1)
    assert first == make_thread_id("a" * 64, "local-20250101T000000Z-1.0", 1)
    others = {
        make_thread_id("a" * 64, "local-20250101T000000Z-1.0", 2),
        make_thread_id("a" * 64, "local-20250101T000000Z-1.1", 1),
        make_thread_id("b" * 64, "local-20250101T000000Z-1.0", 1),
    }
    assert first not in others and len(others) == 3
