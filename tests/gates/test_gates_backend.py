"""The backend's dynamic gates against a real stand-in backend and Postgres: the authenticated
health call, and a canary turn built from the driver exactly as the session should build it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import pytest_asyncio

from pytest_haico.config.experiment import Arm
from pytest_haico.driver.conversation import ConversationSetup
from pytest_haico.driver.snapshots import PostgresSnapshotReader
from pytest_haico.errors import InfraError
from pytest_haico.gates.backend import check_backend_health, check_canary_turn
from pytest_haico.runner.stack_gates import make_canary
from tests.standins.standin_http import ADMIN_TOKEN, MODEL
from tests.standins.standin_procs import BackendServer, BackendServers, LlmServer, LlmServers

ARM = Arm.model_validate({"name": "demo", "model": {"served_name": MODEL}})
PERSONAS = ["helpful", "looper", "blank", "bad_args", "flaky", "slow", "hang"]


@pytest_asyncio.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(trust_env=False) as client:
        yield client


@pytest.fixture(scope="module")
def backend(backend_server: BackendServers) -> BackendServer:
    return backend_server()


@pytest.fixture(scope="module")
def models(llm_server: LlmServers) -> dict[str, LlmServer]:
    started = llm_server.prefetch([(persona, {}) for persona in PERSONAS])
    return dict(zip(PERSONAS, started, strict=True))


@pytest_asyncio.fixture
async def snapshots(backend: BackendServer) -> AsyncIterator[PostgresSnapshotReader]:
    reader = await PostgresSnapshotReader.connect(backend.database_dsn)
    try:
        yield reader
    finally:
        await reader.aclose()


@pytest.mark.asyncio
async def test_the_backend_answers_the_authenticated_health_call(
    client: httpx.AsyncClient, backend: BackendServer
) -> None:
    result = await check_backend_health(client, backend.base_url, token=ADMIN_TOKEN)
    assert result.passed, result
    assert result.detail.startswith("GET /api/health with the admin token: HTTP 200 in ")


@pytest.mark.asyncio
async def test_a_token_the_backend_does_not_know_fails(
    client: httpx.AsyncClient, backend: BackendServer
) -> None:
    result = await check_backend_health(client, backend.base_url, token="not-the-token")
    assert result.failure_line == (
        "gate backend_health failed: the backend refused the run's admin token: HTTP 401: "
        "missing or invalid admin token; the token reaches the backend through "
        "ADMIN_DEFAULT_API_TOKEN: a backend from --haico-backend-cmd or another image must read "
        "it; check the backend's log (runs/<run_id>/logs/)"
    )


@pytest.mark.asyncio
@pytest.mark.parametrize("persona", PERSONAS)
async def test_the_canary_turn_passes_for_every_answering_persona(
    client: httpx.AsyncClient,
    backend: BackendServer,
    models: dict[str, LlmServer],
    snapshots: PostgresSnapshotReader,
    tmp_path: Path,
    persona: str,
) -> None:
    setup = ConversationSetup(
        backend_url=backend.base_url,
        token=ADMIN_TOKEN,
        endpoint_url=models[persona].endpoint_url,
        arm=ARM,
        snapshots=snapshots,
    )
    canary = make_canary(client, setup, transcripts=tmp_path)
    result = await check_canary_turn(canary, arm=ARM)
    assert result.passed, result
    assert result.detail.startswith(f"served by 'vllm', '{MODEL}'")


@pytest.mark.asyncio
async def test_a_backend_that_records_another_model_fails_the_canary(
    client: httpx.AsyncClient,
    backend_server: BackendServers,
    models: dict[str, LlmServer],
    tmp_path: Path,
) -> None:
    substituting = backend_server(substitute_model="gpt-4o")
    reader = await PostgresSnapshotReader.connect(substituting.database_dsn)
    try:
        setup = ConversationSetup(
            backend_url=substituting.base_url,
            token=ADMIN_TOKEN,
            endpoint_url=models["helpful"].endpoint_url,
            arm=ARM,
            snapshots=reader,
        )
        canary = make_canary(client, setup, transcripts=tmp_path)
        result = await check_canary_turn(canary, arm=ARM)
    finally:
        await reader.aclose()
    assert result.failure_line == (
        f"gate canary_turn failed: the canary turn was served by provider 'vllm', model "
        f"'gpt-4o'; the arm expects 'vllm', '{MODEL}'; the backend did not use the arm's model: "
        "check its configuration (no OPENAI_ENDPOINT_URL, an endpoint host containing 'vllm', "
        "the image or --haico-backend-cmd in use)"
    )


@pytest.mark.asyncio
async def test_a_canary_that_keeps_failing_is_retried_then_fails() -> None:
    calls = 0

    async def canary() -> tuple[str | None, str | None]:
        nonlocal calls
        calls += 1
        raise InfraError(f"HTTP 502 from the backend (call {calls})")

    result = await check_canary_turn(canary, arm=ARM, attempts=3)
    assert calls == 3
    assert result.detail == (
        "no turn through the backend succeeded: InfraError: HTTP 502 from the backend (call 1); "
        "InfraError: HTTP 502 from the backend (call 2); InfraError: HTTP 502 from the backend "
        "(call 3)"
    )


@pytest.mark.asyncio
async def test_a_canary_that_succeeds_on_a_retry_says_so_and_a_hung_one_ends() -> None:
    answers: list[tuple[str | None, str | None] | Exception] = [
        InfraError("model answered 500"),
        ("vllm", MODEL),
    ]

    async def flaky() -> tuple[str | None, str | None]:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    result = await check_canary_turn(flaky, arm=ARM)
    assert (result.passed, result.detail) == (
        True,
        f"served by 'vllm', '{MODEL}' (after 1 failed turn)",
    )

    async def hung() -> tuple[str | None, str | None]:
        await asyncio.sleep(60)
        raise AssertionError("unreachable")

    result = await check_canary_turn(hung, arm=ARM, timeout_s=0.2)
    assert result.detail == (
        "no turn through the backend succeeded: no end of the turn within the canary's 0.2 s"
    )


@pytest.mark.asyncio
async def test_a_snapshot_row_without_provider_or_model_fails() -> None:
    async def anonymous() -> tuple[str | None, str | None]:
        return None, None

    result = await check_canary_turn(anonymous, arm=ARM)
    assert not result.passed
    assert "which model served a turn cannot be checked" in result.detail
