"""The driver against the real local stack: dead services, refused auth, cut streams, snapshots."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest

from pytest_haico.config.experiment import Arm, Script
from pytest_haico.driver.conversation import ConversationSetup, make_thread_id, run_conversation
from pytest_haico.driver.result import ConversationResult
from pytest_haico.driver.snapshots import VLLM_PROVIDER, PostgresSnapshotReader
from pytest_haico.ledger.verdicts import Outcome, Verdict
from pytest_haico.redact import Redactor
from pytest_haico.stack.local import build_local_stack
from pytest_haico.stack.profiles import Stack
from pytest_haico.stack.request import StackRequest
from tests.polling import wait_for_async

SERVED_NAME = "live"
TURN_TIMEOUT_S = 30.0
INSERT_SNAPSHOT = (
    "INSERT INTO workspace_snapshots (thread_id, turn_index, provider, model_id, outcome) "
    "VALUES ('forged', 0, 'vllm', 'forged', 'complete')"
)

ARM = Arm.model_validate(
    {
        "name": SERVED_NAME,
        "model": {"served_name": SERVED_NAME},
        "run": {"turn_timeout_s": TURN_TIMEOUT_S},
    }
)
SCRIPT = Script.model_validate(
    {"id": "two-turns", "turns": [{"user": "Hello, who are you?"}, {"user": "Say it again."}]}
)
# A turn that makes the model call a tool: a hanging model answers that first call, then
# holds the next (the tool's result going back), and the turn stays in flight.
HANGING_SCRIPT = Script.model_validate(
    {"id": "one-artifact", "turns": [{"user": "Write it up as a document."}]}
)


def _stack(tmp_path_factory: pytest.TempPathFactory, persona: str) -> Stack:
    root = tmp_path_factory.mktemp(f"stack-{persona}")
    arm = Arm.model_validate(
        {"name": SERVED_NAME, "vllm": {"max_model_len": 4096}, "standin": {"persona": persona}}
    )
    return build_local_stack(StackRequest(arm=arm, run_dir=root, state_dir=root))


@pytest.fixture(scope="module")
def helpful_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A running local stack whose model answers; tests must leave it working."""
    with _stack(tmp_path_factory, "helpful") as stack:
        yield stack


@pytest.fixture
def breakable_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A running local stack of its own, for a test that kills one of its services."""
    with _stack(tmp_path_factory, "helpful") as stack:
        yield stack


@pytest.fixture
def hanging_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A running local stack whose model holds every request that goes on with a
    conversation, so a turn that calls a tool stays in flight."""
    with _stack(tmp_path_factory, "hang") as stack:
        yield stack


async def _converse(
    stack: Stack,
    transcript: Path,
    *,
    attempt: int = 1,
    token: str | None = None,
    script: Script = SCRIPT,
) -> ConversationResult:
    """Run SCRIPT once, as the arm session does: its own client, a read-only snapshot reader."""
    reader = await PostgresSnapshotReader.connect(stack.readonly_dsn)
    try:
        async with httpx.AsyncClient(trust_env=False, timeout=None) as client:
            setup = ConversationSetup(
                backend_url=stack.backend_url,
                token=stack.admin_token if token is None else token,
                endpoint_url=stack.model_endpoint,
                arm=ARM,
                snapshots=reader,
                redactor=Redactor(stack.secrets),
            )
            return await run_conversation(
                client,
                setup,
                script=script,
                thread_id=make_thread_id(transcript.stem, "live", attempt),
                transcript_path=transcript,
            )
    finally:
        await reader.aclose()


def _transcript_kinds(path: Path) -> list[str]:
    """The ``kind`` of every complete line written so far (the writer may be mid-line)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    return [json.loads(line)["kind"] for line in text[: text.rfind("\n") + 1].splitlines()]


def _backend_health(stack: Stack) -> httpx.Response:
    return httpx.get(
        f"{stack.backend_url}/api/health",
        headers={"Authorization": f"Bearer {stack.admin_token}"},
        trust_env=False,
        timeout=5.0,
    )


@pytest.mark.asyncio
async def test_a_completed_conversation_leaves_a_snapshot_row_readable_read_only(
    helpful_stack: Stack, tmp_path: Path
) -> None:
    result = await _converse(helpful_stack, tmp_path / "completed.jsonl")

    assert result.verdict is Verdict.COMPLETED, result.error
    assert result.error is None
    assert [turn.index for turn in result.turns] == [0, 1]
    reader = await PostgresSnapshotReader.connect(helpful_stack.readonly_dsn)
    try:
        for turn in result.turns:
            assert turn.thread_id is not None
            snapshot = await reader.read(turn.thread_id, turn.index)
            assert snapshot is not None
            assert snapshot.snapshot_id == turn.snapshot_id
            assert (snapshot.provider, snapshot.model_id) == (VLLM_PROVIDER, SERVED_NAME)
    finally:
        await reader.aclose()


def test_the_readonly_dsn_cannot_insert_into_workspace_snapshots(helpful_stack: Stack) -> None:
    with psycopg.connect(helpful_stack.readonly_dsn, autocommit=True) as conn:
        with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
            conn.execute(INSERT_SNAPSHOT)
        # Even a client that turns read-only off has no INSERT privilege.
        conn.execute("SET default_transaction_read_only = off")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(INSERT_SNAPSHOT)
        count = conn.execute("SELECT count(*) FROM workspace_snapshots WHERE thread_id = 'forged'")
        assert count.fetchone() == (0,)


@pytest.mark.asyncio
async def test_a_refused_token_is_an_infra_error_and_stays_out_of_the_transcript(
    helpful_stack: Stack, tmp_path: Path
) -> None:
    wrong = f"wrong-{secrets.token_urlsafe(16)}"
    transcript = tmp_path / "refused.jsonl"

    result = await _converse(helpful_stack, transcript, token=wrong)

    assert result.verdict is Verdict.INFRA_ERROR
    assert result.verdict.outcome is Outcome.ERROR
    assert result.error is not None
    assert result.error.kind == "http_status"
    assert result.error.message == (
        f"HTTP 401 from {helpful_stack.backend_url}/api/query/stream_steps/sse: "
        '{"detail":"missing or invalid admin token"}'
    )
    assert len(result.turns) == 1  # the rest of the script is not sent
    assert _transcript_kinds(transcript) == ["request", "response", "finding"]
    text = transcript.read_text()
    assert wrong not in text
    assert not [secret for secret in helpful_stack.secrets if secret in text]


@pytest.mark.asyncio
async def test_a_killed_model_server_is_an_infra_error_while_the_backend_stays_up(
    breakable_stack: Stack, tmp_path: Path
) -> None:
    before = await _converse(breakable_stack, tmp_path / "before.jsonl")
    assert before.verdict is Verdict.COMPLETED, before.error
    llm = breakable_stack.orchestrator.processes["llm"]
    assert llm.pid is not None

    os.kill(llm.pid, signal.SIGKILL)
    await wait_for_async(lambda: llm.exit_status() is not None, timeout=10, what="the LLM to die")
    after = await _converse(breakable_stack, tmp_path / "after.jsonl")

    assert llm.exit_status() == -signal.SIGKILL
    assert after.verdict is Verdict.INFRA_ERROR
    assert after.error is not None
    assert after.error.kind == "backend_model"
    assert after.error.message.startswith("the backend reported an error of kind 'model': ")
    assert "Connection error" in after.error.message  # not a turn timeout
    assert len(after.turns) == 1
    assert breakable_stack.orchestrator.processes["backend"].exit_status() is None
    assert _backend_health(breakable_stack).json() == {"status": "ok"}


@pytest.mark.asyncio
async def test_a_backend_killed_mid_stream_is_a_broken_stream_before_the_turn_timeout(
    hanging_stack: Stack, tmp_path: Path
) -> None:
    transcript = tmp_path / "cut.jsonl"
    conversation = asyncio.create_task(_converse(hanging_stack, transcript, script=HANGING_SCRIPT))
    llm_log = hanging_stack.log_paths["llm"]
    try:
        await wait_for_async(
            lambda: (
                "persona hang holds the request" in llm_log.read_text(errors="replace")
                and _transcript_kinds(transcript)[:2] == ["request", "response"]
            ),
            timeout=15,
            what="the model to hold the turn's second request",
        )
        assert not conversation.done()  # the model hangs: the turn is still streaming
        backend = hanging_stack.orchestrator.processes["backend"]
        assert backend.pid is not None
        os.kill(backend.pid, signal.SIGKILL)
        result = await asyncio.wait_for(conversation, TURN_TIMEOUT_S + 5)
    finally:
        if not conversation.done():  # a failed wait must not leave the turn running
            conversation.cancel()
            await asyncio.gather(conversation, return_exceptions=True)

    assert result.verdict is Verdict.INFRA_ERROR
    assert result.error is not None
    assert result.error.kind == "broken_stream"
    assert result.error.message == (
        f"{hanging_stack.backend_url}/api/query/stream_steps/sse: RemoteProtocolError: peer "
        "closed connection without sending complete message body (incomplete chunked read)"
    )
    assert len(result.turns) == 1
    kinds = _transcript_kinds(transcript)
    assert kinds[:2] == ["request", "response"] and kinds[-1] == "finding", kinds
    assert set(kinds[2:-1]) <= {"event"}, kinds  # the tool call's steps
