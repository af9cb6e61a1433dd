"""Each verdict the driver gives, and the precedence between them."""

from __future__ import annotations

import httpx
import psycopg
import pytest

from pytest_haico.driver.snapshots import Snapshot
from pytest_haico.ledger.verdicts import Verdict
from tests.driver.driver_fakes import (
    CANNED,
    SERVED,
    TOKEN,
    Converse,
    FakeBackend,
    FakeSnapshots,
    Reply,
    answer,
    complete,
    error,
    make_arm,
    make_script,
    step,
    tool_call,
)

pytestmark = pytest.mark.asyncio


async def test_a_real_answer_on_every_turn_completes(converse: Converse) -> None:
    backend = FakeBackend(answer(tokens=(120, 30)), answer())
    done = await converse(backend, make_script("Plan a trip.", "Shorter, please."))
    assert done.result.verdict is Verdict.COMPLETED
    assert done.result.error is None
    assert [turn.index for turn in done.result.turns] == [0, 1]
    first = done.result.turns[0]
    assert (first.steps, first.tool_calls, first.tool_errors) == (1, 0, 0)
    assert (first.tokens_in, first.tokens_out) == (120, 30)
    assert (first.provider, first.model_id) == ("vllm", SERVED)
    assert first.snapshot_id == "snap-thread-0-0"
    assert first.latency_s is not None and first.first_event_s is not None
    assert 0 <= first.first_event_s <= first.latency_s
    assert done.result.duration_s >= 0
    assert done.result.started_at <= done.result.finished_at


async def test_request_carries_token_query_and_arm_config(converse: Converse) -> None:
    backend = FakeBackend(answer())
    await converse(backend, make_script("Plan a trip to Crete."))
    (request,) = backend.requests
    assert request.method == "POST"
    assert str(request.url) == "http://127.0.0.1:18080/api/query/stream_steps/sse"
    assert request.headers["authorization"] == f"Bearer {TOKEN}"
    assert backend.bodies[0] == {
        "query": "Plan a trip to Crete.",
        "thread_id": "thread-0",
        "branch_from_turn": None,
        "config": {
            "model": {
                "API": "openai",
                "model_id": SERVED,
                "endpoint_url": "http://vllm.localhost:18000/v1",
                "max_tokens": 512,
                "temperature": 0.0,
            },
            "agent": {"recursion_limit": 25},
        },
    }


async def test_tool_calls_and_tool_errors_are_counted(converse: Converse) -> None:
    chunks = [
        step("", tool_calls=[tool_call("a"), tool_call("b")]),
        step("bad arguments", message_type="tool", tool_error="validation failed"),
        step("ok", message_type="tool", tool_error=False),
        *answer(),
    ]
    done = await converse(FakeBackend(chunks))
    turn = done.result.turns[0]
    assert (turn.steps, turn.tool_calls, turn.tool_errors) == (4, 2, 1)
    assert done.result.verdict is Verdict.COMPLETED


# --- recursion limit --------------------------------------------------------


async def test_backend_flag_is_recursion_limit(converse: Converse) -> None:
    done = await converse(FakeBackend(answer("partial", recursion=True)))
    assert done.result.verdict is Verdict.RECURSION_LIMIT
    assert done.result.error is not None
    assert "recursion_limit_reached" in done.result.error.message


async def test_recursion_limit_error_event_is_recursion_limit_and_the_script_goes_on(
    converse: Converse,
) -> None:
    looping = [step("", tool_calls=[tool_call()]), step(CANNED), error("recursion_limit")]
    backend = FakeBackend(looping, answer())
    done = await converse(backend, make_script("Loop.", "Then answer."))
    assert done.result.verdict is Verdict.RECURSION_LIMIT
    assert len(backend.requests) == 2
    assert done.result.turns[0].tokens_in is None  # no complete, no usage


async def test_canned_reply_alone_is_caught_when_the_flag_is_false(converse: Converse) -> None:
    # LangGraph at an even limit: the graph ends normally with the canned text.
    chunks = [step("", tool_calls=[tool_call()]), step("result", message_type="tool"), step(CANNED)]
    done = await converse(FakeBackend([*chunks, complete(recursion=False)]))
    assert done.result.verdict is Verdict.RECURSION_LIMIT
    assert done.result.error is not None
    assert "canned reply" in done.result.error.message


async def test_step_count_reaching_the_limit_is_recursion_limit(converse: Converse) -> None:
    chunks = [
        step("", tool_calls=[tool_call()]),
        step("result", message_type="tool"),
        step("The answer."),
        complete(),
    ]
    done = await converse(FakeBackend(chunks), arm=make_arm(recursion_limit=3))
    assert done.result.verdict is Verdict.RECURSION_LIMIT
    assert done.result.error is not None
    assert "3 steps" in done.result.error.message


async def test_step_count_below_the_limit_completes(converse: Converse) -> None:
    chunks = [step("", tool_calls=[tool_call()]), step("The answer."), complete()]
    done = await converse(FakeBackend(chunks), arm=make_arm(recursion_limit=3))
    assert done.result.verdict is Verdict.COMPLETED


async def test_bad_tool_arguments_loop_ends_as_recursion_limit_with_tool_errors(
    converse: Converse,
) -> None:
    chunks = [
        step("", tool_calls=[tool_call()]),
        step("invalid args", message_type="tool", tool_error=True),
        step("", tool_calls=[tool_call()]),
        step("invalid args", message_type="tool", tool_error=True),
        step(CANNED),
        complete(),
    ]
    done = await converse(FakeBackend(chunks), arm=make_arm(recursion_limit=4))
    assert done.result.verdict is Verdict.RECURSION_LIMIT
    assert done.result.turns[0].tool_errors == 2


# --- blank turn and expectations ---------------------------------------------


@pytest.mark.parametrize(
    "chunks",
    [
        pytest.param([step(""), complete()], id="empty-final-step"),
        pytest.param([step("  \n"), complete()], id="whitespace-final-step"),
        pytest.param([step(None), complete()], id="null-content"),
        pytest.param([complete()], id="no-step-at-all"),
    ],
)
async def test_empty_final_answer_without_tool_call_is_blank(
    converse: Converse, chunks: list[bytes]
) -> None:
    done = await converse(FakeBackend(chunks))
    assert done.result.verdict is Verdict.BLANK_TURN


async def test_missing_artifact_fails_the_expectation(converse: Converse) -> None:
    script = make_script("Plan it.", {"user": "Write it up.", "expect": {"artifact": True}})
    done = await converse(FakeBackend(answer(), answer()), script)
    assert done.result.verdict is Verdict.EXPECTATION_FAILED
    assert done.result.error is not None
    assert done.result.error.message == "turn 2: expected an artifact, got no artifact in 1 step"


async def test_artifact_in_any_step_meets_the_expectation(converse: Converse) -> None:
    chunks = [
        step("", tool_calls=[tool_call("write")]),
        step("saved", message_type="tool", artifact={"id": "doc-1", "kind": "document"}),
        *answer(),
    ]
    script = make_script({"user": "Write it up.", "expect": {"artifact": True}})
    done = await converse(FakeBackend(chunks), script)
    assert done.result.verdict is Verdict.COMPLETED


# --- substitution ------------------------------------------------------------


@pytest.mark.parametrize(
    ("provider", "model_id"),
    [("openai", SERVED), ("vllm", "qwen7b"), ("openai", "gpt-4o")],
)
async def test_another_provider_or_model_is_substituted(
    converse: Converse, provider: str, model_id: str
) -> None:
    snapshots = FakeSnapshots(served={1: (provider, model_id)})
    backend = FakeBackend(answer(), answer(), answer())
    done = await converse(backend, make_script("a", "b", "c"), snapshots=snapshots)
    assert done.result.verdict is Verdict.SUBSTITUTED
    assert done.result.error is not None
    assert done.result.error.kind == "substituted"
    assert repr(model_id) in done.result.error.message
    assert (done.result.turns[1].provider, done.result.turns[1].model_id) == (provider, model_id)
    assert len(backend.requests) == 2  # no further turn runs on the wrong model


async def test_missing_snapshot_after_complete_is_infra_error(converse: Converse) -> None:
    done = await converse(FakeBackend(answer()), snapshots=FakeSnapshots(missing=True))
    assert done.result.verdict is Verdict.INFRA_ERROR
    assert done.result.error is not None
    assert done.result.error.kind == "snapshot"


async def test_missing_snapshot_after_recursion_error_is_tolerated(converse: Converse) -> None:
    chunks = [step(CANNED), error("recursion_limit")]
    done = await converse(FakeBackend(chunks), snapshots=FakeSnapshots(missing=True))
    assert done.result.verdict is Verdict.RECURSION_LIMIT
    assert done.result.turns[0].snapshot_id is None


async def test_snapshot_read_failure_is_infra_error_with_redacted_message(
    converse: Converse,
) -> None:
    failure = psycopg.OperationalError(f"connection failed: password={TOKEN} refused")
    done = await converse(FakeBackend(answer()), snapshots=FakeSnapshots(fail=failure))
    assert done.result.verdict is Verdict.INFRA_ERROR
    assert done.result.error is not None
    assert done.result.error.kind == "snapshot"
    assert TOKEN not in done.result.error.message
    assert "[REDACTED]" in done.result.error.message


async def test_snapshot_that_appears_late_is_waited_for(converse: Converse) -> None:
    class LateSnapshots(FakeSnapshots):
        async def read(self, thread_id: str, turn_index: int) -> Snapshot | None:
            row = await super().read(thread_id, turn_index)
            return row if len(self.reads) >= 3 else None

    snapshots = LateSnapshots()
    done = await converse(FakeBackend(answer()), snapshots=snapshots, snapshot_wait_s=2.0)
    assert done.result.verdict is Verdict.COMPLETED
    assert len(snapshots.reads) == 3


# --- infrastructure ------------------------------------------------------------


@pytest.mark.parametrize("status", [401, 403, 500, 502, 503])
async def test_refused_or_failing_backend_is_infra_error(converse: Converse, status: int) -> None:
    reply = Reply(chunks=[b'{"detail": "nope"}'], status=status, content_type="application/json")
    backend = FakeBackend(reply, answer())
    done = await converse(backend, make_script("a", "b"))
    assert done.result.verdict is Verdict.INFRA_ERROR
    assert done.result.error is not None
    assert done.result.error.kind == "http_status"
    assert done.result.error.message.startswith(f"HTTP {status} from ")
    assert '"nope"' in done.result.error.message
    assert len(backend.requests) == 1  # the remaining turns are not sent


async def test_429_is_rate_limited(converse: Converse) -> None:
    reply = Reply(status=429, content_type="application/json")
    done = await converse(FakeBackend(reply))
    assert done.result.verdict is Verdict.RATE_LIMITED
    assert done.result.error is not None
    assert done.result.error.kind == "rate_limited"


async def test_unreachable_backend_is_infra_error(converse: Converse) -> None:
    class Refusing(FakeBackend):
        def _handle(self, request: httpx.Request) -> httpx.Response:
            raise httpx.ConnectError("[Errno 111] Connection refused", request=request)

    done = await converse(Refusing())
    assert done.result.verdict is Verdict.INFRA_ERROR
    assert done.result.error is not None
    assert done.result.error.kind == "unreachable"
    assert "Connection refused" in done.result.error.message


@pytest.mark.parametrize("kind", ["auth", "model", "internal", "something_new"])
async def test_backend_error_event_is_infra_error(converse: Converse, kind: str) -> None:
    backend = FakeBackend([step("thinking"), error(kind, "upstream said no")], answer())
    done = await converse(backend, make_script("a", "b"))
    assert done.result.verdict is Verdict.INFRA_ERROR
    assert done.result.error is not None
    assert done.result.error.kind == f"backend_{kind}"
    assert "upstream said no" in done.result.error.message
    assert len(backend.requests) == 1


async def test_turn_that_never_answers_times_out(converse: Converse) -> None:
    backend = FakeBackend(Reply(chunks=[b": keep-alive\n\n"], hang=True), answer())
    done = await converse(backend, make_script("a", "b"), turn_timeout_s=0.05)
    assert done.result.verdict is Verdict.INFRA_ERROR
    assert done.result.error is not None
    assert done.result.error.kind == "timeout"
    assert "no end of turn within 0.05 s" in done.result.error.message
    assert len(backend.requests) == 1
    assert done.result.turns[0].latency_s is not None


async def test_turn_timeout_defaults_to_the_arm(converse: Converse) -> None:
    backend = FakeBackend(Reply(chunks=[step("working")], hang=True))
    done = await converse(backend, arm=make_arm(turn_timeout_s=0.05))
    assert done.result.verdict is Verdict.INFRA_ERROR
    assert done.result.turns[0].steps == 1


# --- precedence ----------------------------------------------------------------


async def test_substituted_beats_recursion_limit(converse: Converse) -> None:
    snapshots = FakeSnapshots(provider="openai", model_id="gpt-4o")
    done = await converse(FakeBackend([step(CANNED), complete()]), snapshots=snapshots)
    assert done.result.verdict is Verdict.SUBSTITUTED


async def test_infra_error_in_a_later_turn_beats_recursion_limit(converse: Converse) -> None:
    backend = FakeBackend(answer(recursion=True), Reply(status=500))
    done = await converse(backend, make_script("a", "b"))
    assert done.result.verdict is Verdict.INFRA_ERROR
    assert done.result.error is not None
    assert done.result.error.kind == "http_status"


async def test_recursion_limit_beats_blank_and_expectation(converse: Converse) -> None:
    script = make_script("a", {"user": "b", "expect": {"artifact": True}}, "c")
    backend = FakeBackend([step(""), complete()], answer(), [step(CANNED), complete()])
    done = await converse(backend, script)
    assert done.result.verdict is Verdict.RECURSION_LIMIT
    assert done.result.error is not None
    assert done.result.error.message.startswith("turn 3 hit the recursion limit")


async def test_blank_beats_expectation_failed(converse: Converse) -> None:
    script = make_script({"user": "a", "expect": {"artifact": True}}, "b")
    done = await converse(FakeBackend(answer(), [step(""), complete()]), script)
    assert done.result.verdict is Verdict.BLANK_TURN
