"""An arm's way to its running stack, on the runner's loop: one HTTP client and one snapshot
reader, for the dynamic gates, each conversation and the model server's health."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Protocol

import httpx

from pytest_haico import httpclient
from pytest_haico.driver.conversation import (
    ConversationProgress,
    ConversationSetup,
    make_thread_id,
    run_conversation,
)
from pytest_haico.driver.result import ConversationResult
from pytest_haico.driver.snapshots import PostgresSnapshotReader
from pytest_haico.driver.transcripts import transcript_header
from pytest_haico.errors import StackError
from pytest_haico.gates.result import GateResult, arun_gates
from pytest_haico.ledger.recorder import ItemAttempt
from pytest_haico.redact import Redactor
from pytest_haico.runner.arm_request import ArmRunRequest
from pytest_haico.runner.stack_gates import dynamic_gates, make_canary
from pytest_haico.runner.stack_life import RunStack


class Channel(Protocol):
    """What the conversations of an arm use of its stack; every call on the runner's loop."""

    async def open(self) -> None: ...
    async def dynamic_gates(self) -> tuple[GateResult, ...]: ...
    async def converse(
        self, state: ItemAttempt, progress: ConversationProgress
    ) -> ConversationResult: ...
    async def model_server_answers(self) -> bool: ...
    async def close(self) -> None: ...


class BackendChannel:
    """The `Channel` of a real stack: its backend, its model server, its Postgres."""

    def __init__(self, stack: RunStack, request: ArmRunRequest, redactor: Redactor) -> None:
        self._stack = stack
        self._arm = request.arm
        self._concurrency = request.in_flight.maximum
        self._claim = request.recorder.claim(request.arm.name)
        self._paths = request.recorder.paths(request.arm.name)
        self._redactor = redactor
        self._judge = request.judge
        self._client: httpx.AsyncClient | None = None
        self._snapshots: PostgresSnapshotReader | None = None
        self._setup: ConversationSetup | None = None  # once open

    async def open(self) -> None:
        # A cluster's proxy settings must never apply to loopback. One kept-alive
        # connection per conversation in flight; expiring before uvicorn's 5 s idle
        # timeout, so a turn is never sent on a connection the server is closing.
        limits = httpx.Limits(
            max_connections=None,
            max_keepalive_connections=self._concurrency,
            keepalive_expiry=3.0,
        )
        self._client = httpclient.async_client(timeout=None, limits=limits)
        try:
            self._snapshots = await PostgresSnapshotReader.connect(self._stack.readonly_dsn)
        except Exception as exc:
            message = f"the snapshot connection to postgres failed: {type(exc).__name__}: {exc}"
            raise StackError(self._redactor.redact(message)) from exc
        stack = self._stack
        self._setup = ConversationSetup(
            backend_url=stack.backend_url,
            token=stack.admin_token,
            endpoint_url=stack.model_endpoint,
            arm=self._arm,
            snapshots=self._snapshots,
            redactor=self._redactor,
            judge=self._judge,
        )

    async def dynamic_gates(self) -> tuple[GateResult, ...]:
        """The model server's and the backend's gates, in DESIGN's order."""
        stack = self._stack
        async with httpclient.async_client() as client:
            assert self._setup is not None
            canary = make_canary(client, self._setup, transcripts=self._claim.path)
            gates = dynamic_gates(client, stack, self._arm, canary)
            return await arun_gates(gates, redactor=self._redactor)

    async def converse(
        self, state: ItemAttempt, progress: ConversationProgress
    ) -> ConversationResult:
        """The item's conversation through the backend; `progress` keeps what it got so far."""
        assert self._client is not None and self._setup is not None
        spec = state.spec
        run_id = self._claim.run_id
        thread_id = make_thread_id(spec.item_id, run_id, state.attempt)
        header = transcript_header(
            item_id=spec.item_id,
            run_id=run_id,
            attempt=state.attempt,
            arm=spec.arm.name,
            script=spec.script.id,
            repeat=spec.repeat,
            nodeid=state.nodeid,
            thread_id=thread_id,
            started_at=datetime.now(UTC).isoformat(timespec="microseconds"),
        )
        return await run_conversation(
            self._client,
            self._setup,
            script=spec.script,
            thread_id=thread_id,
            transcript_path=self._paths.transcript(spec.item_id, run_id, state.attempt),
            transcript_header=header,
            progress=progress,
        )

    async def model_server_answers(self) -> bool:
        """Whether the model server's /health answers 200 now."""
        assert self._client is not None
        try:
            response = await self._client.get(f"{self._stack.llm_url}/health", timeout=2.0)
        except httpx.HTTPError:
            return False
        return response.status_code == 200

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
        if self._snapshots is not None:
            await self._snapshots.aclose()
