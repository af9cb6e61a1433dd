"""The backend's small parts: the vllm host rule, ``*.localhost`` names, the rate limiter,
waiting for the database, the agent cache, counting tokens, the inline executor, the next
turn index."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import threading
from collections.abc import AsyncIterator
from typing import Any

import httpx
import psycopg
import pytest
import pytest_asyncio
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage
from langgraph.checkpoint.memory import InMemorySaver
from psycopg import AsyncConnection
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import DictRow
from psycopg_pool import AsyncConnectionPool

from pytest_haico.standins.agent import AgentCache
from pytest_haico.standins.backend_app import CONNECTION_OPTIONS, InlineExecutor
from pytest_haico.standins.backend_wire import ModelConfig
from pytest_haico.standins.model_client import (
    LoopbackTransport,
    SyncLoopbackTransport,
    build_http_clients,
    endpoint_refusal,
)
from pytest_haico.standins.rate_limit import SlidingWindowLimiter
from pytest_haico.standins.snapshots import (
    Pool,
    Snapshot,
    SnapshotStore,
    setup_database,
    wait_for_database,
)
from pytest_haico.standins.turns import TurnUsage
from tests.standins.standin_procs import LlmServers, create_database, free_port


@pytest.mark.parametrize(
    "url",
    ["http://vllm.localhost:8000/v1", "http://my-vllm-node:8000/v1", "https://vllm.example.org/v1"],
)
def test_endpoints_on_a_vllm_host_are_accepted(url: str) -> None:
    assert endpoint_refusal(url) is None


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://localhost:8000/v1", "must contain 'vllm'"),
        ("http://api.openai.com/v1/vllm", "must contain 'vllm'"),
        ("ftp://vllm.localhost/v1", "must be an http or https URL"),
    ],
)
def test_endpoints_elsewhere_are_refused_naming_the_rule(url: str, reason: str) -> None:
    refusal = endpoint_refusal(url)
    assert refusal is not None
    assert reason in refusal


@pytest.mark.asyncio
async def test_localhost_names_reach_loopback_keeping_their_host_header(
    llm_server: LlmServers,
) -> None:
    port = llm_server().process.port
    seen: list[str] = []

    async def record(request: httpx.Request) -> None:
        seen.append(request.headers["host"])

    async with httpx.AsyncClient(
        transport=LoopbackTransport(), trust_env=False, event_hooks={"request": [record]}
    ) as client:
        for host in ("vllm.localhost", "a.b.localhost", "localhost"):
            response = await client.get(f"http://{host}:{port}/health")
            assert response.status_code == 200
            assert str(response.request.url.host) == "127.0.0.1"
    assert seen == [f"vllm.localhost:{port}", f"a.b.localhost:{port}", f"localhost:{port}"]


def test_the_synchronous_client_maps_localhost_names_too(llm_server: LlmServers) -> None:
    port = llm_server().process.port
    with httpx.Client(transport=SyncLoopbackTransport(), trust_env=False) as client:
        response = client.get(f"http://vllm.localhost:{port}/health")
    assert response.status_code == 200
    assert response.request.headers["host"] == f"vllm.localhost:{port}"


@pytest_asyncio.fixture
async def agents() -> AsyncIterator[AgentCache]:
    clients = build_http_clients()
    try:
        yield AgentCache(InMemorySaver(), http_clients=clients, api_key=None, size=2)
    finally:
        await clients.aclose()


def model_config(model_id: str, **fields: Any) -> ModelConfig:
    return ModelConfig(
        API="openai", model_id=model_id, endpoint_url="http://vllm.localhost:9/v1", **fields
    )


@pytest.mark.asyncio
async def test_one_agent_per_model_config_the_least_recently_used_dropped(
    agents: AgentCache,
) -> None:
    first = agents.get(model_config("a"))
    assert agents.get(model_config("a")) is first
    assert agents.get(model_config("a", max_tokens=64)) is not first
    agents.get(model_config("a"))  # now the most recently used
    agents.get(model_config("b"))  # evicts max_tokens=64, not "a"
    assert agents.get(model_config("a")) is first


@pytest.mark.asyncio
async def test_counting_tokens_sends_no_event_to_the_thread_pool(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    loop = asyncio.get_running_loop()
    hops: list[object] = []
    run_in_executor = loop.run_in_executor

    def spy(*args: Any) -> Any:
        hops.append(args[1])
        return run_in_executor(*args)

    monkeypatch.setattr(loop, "run_in_executor", spy)
    reply = AIMessage(
        "hello",
        usage_metadata={"input_tokens": 3, "output_tokens": 2, "total_tokens": 5},
        response_metadata={"model_name": "m"},
    )
    # The fake model itself runs in the pool once; a plain handler would add a hop per event.
    await GenericFakeChatModel(messages=iter([reply])).ainvoke("q")
    baseline = len(hops)
    usage = TurnUsage()
    await GenericFakeChatModel(messages=iter([reply])).ainvoke("q", {"callbacks": [usage]})
    assert len(hops) == 2 * baseline
    assert usage.usage_metadata["m"]["input_tokens"] == 3
    assert usage.usage_metadata["m"]["output_tokens"] == 2


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_limiter_admits_n_per_sliding_minute() -> None:
    clock = FakeClock()
    limiter = SlidingWindowLimiter(2, clock=clock)
    assert limiter.admit() is None
    clock.now += 20
    assert limiter.admit() is None
    assert limiter.admit() == 40  # the first admission leaves the window in 40 s
    clock.now += 40
    assert limiter.admit() is None, "the first admission has left the window"
    assert limiter.admit() == 20


async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError):
        while data := await source.read(65536):
            sink.write(data)
            await sink.drain()
    sink.close()


@pytest.mark.asyncio
async def test_waiting_for_a_database_that_comes_up_late_returns_once_it_answers(
    postgres_dsn: str,
) -> None:
    # A forwarder to the real server that listens only after a while: a Postgres still starting.
    target = conninfo_to_dict(postgres_dsn)
    port = free_port()
    connections: list[asyncio.StreamWriter] = []

    async def forward(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream = await asyncio.open_connection(str(target["host"]), int(str(target["port"])))
        connections.extend((writer, upstream[1]))
        await asyncio.gather(_pipe(reader, upstream[1]), _pipe(upstream[0], writer))

    async def listen_late() -> asyncio.Server:
        await asyncio.sleep(0.3)
        return await asyncio.start_server(forward, "127.0.0.1", port)

    listening = asyncio.create_task(listen_late())
    await wait_for_database(make_conninfo(postgres_dsn, port=port), timeout=10)
    server = await listening
    server.close()
    # The connections through it: closed here, not by the GC after the loop's end.
    for writer in connections:
        writer.close()
    await asyncio.gather(*(w.wait_closed() for w in connections), return_exceptions=True)
    await server.wait_closed()


@pytest.mark.asyncio
async def test_waiting_for_a_database_that_never_answers_raises_its_last_error() -> None:
    dsn = f"postgresql://postgres:secret@127.0.0.1:{free_port()}/haico"
    with pytest.raises(psycopg.OperationalError, match="Connection refused"):
        await wait_for_database(dsn, timeout=0.3)


SETUP_IN_A_THREAD = """
import os, sys
from pytest_haico.standins.snapshots import start_database_setup
before = set(sys.modules)
start_database_setup(os.environ["DSN"], timeout=10).result(timeout=60)
print(sorted(set(sys.modules) - before))
"""


def test_the_database_is_set_up_in_a_thread_that_imports_nothing(postgres_dsn: str) -> None:
    # The backend's main thread imports LangGraph meanwhile: a second importer could meet
    # half-initialised modules.
    dsn = create_database(postgres_dsn)
    env = {**os.environ, "DSN": dsn}
    command = [sys.executable, "-c", SETUP_IN_A_THREAD]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
    with psycopg.connect(dsn) as conn:
        tables = {row[0] for row in conn.execute("SELECT tablename FROM pg_tables")}
    assert {"checkpoints", "checkpoint_writes", "workspace_snapshots"} <= tables


@pytest.mark.asyncio
async def test_the_inline_executor_runs_to_thread_calls_in_the_loops_thread() -> None:
    loop = asyncio.get_running_loop()
    loop.set_default_executor(InlineExecutor())
    caller, threads = threading.get_ident(), threading.active_count()

    def fail() -> None:
        raise ValueError("from the function")

    assert await asyncio.to_thread(threading.get_ident) == caller
    assert await loop.run_in_executor(None, sum, [1, 2, 3]) == 6
    with pytest.raises(ValueError, match="from the function"):
        await asyncio.to_thread(fail)
    assert threading.active_count() == threads


def _snapshot(thread_id: str, turn_index: int) -> Snapshot:
    return Snapshot(
        thread_id=thread_id,
        turn_index=turn_index,
        branch_from=None,
        parent_thread_id=None,
        provider="vllm",
        model_id="m",
        outcome="complete",
        error_kind=None,
        tokens_in=1,
        tokens_out=1,
    )


@pytest.mark.asyncio
async def test_a_threads_next_turn_index_is_remembered_and_looked_up_after_a_restart(
    postgres_dsn: str,
) -> None:
    dsn = create_database(postgres_dsn)
    await setup_database(dsn, timeout=10)
    pool: Pool = AsyncConnectionPool(
        dsn, connection_class=AsyncConnection[DictRow], kwargs=CONNECTION_OPTIONS, open=False
    )
    async with pool:
        store = SnapshotStore(pool)
        assert await store.next_turn_index("t") == 0
        for turn in (0, 1):
            await store.record(_snapshot("t", turn))
        # Turn 1's row gone behind the store's back: it still counts from what it wrote ...
        async with pool.connection() as conn:
            await conn.execute("DELETE FROM workspace_snapshots WHERE turn_index = 1")
        assert await store.next_turn_index("t") == 2
        # ... and a store that wrote nothing yet (a restarted backend's) looks it up.
        restarted = SnapshotStore(pool)
        assert await restarted.next_turn_index("t") == 1
        assert await restarted.next_turn_index("another") == 0
