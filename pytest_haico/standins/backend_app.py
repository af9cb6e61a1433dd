"""The stand-in backend's HTTP app: auth, rate limit, query validation, the SSE turn stream."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import hmac
import logging
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from psycopg import AsyncConnection
from psycopg.rows import DictRow, dict_row
from psycopg_pool import AsyncConnectionPool
from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from pytest_haico.redact import Redactor
from pytest_haico.standins.agent import AgentCache, warm_up
from pytest_haico.standins.backend_wire import QueryRequest, error_event, sse_data
from pytest_haico.standins.model_client import (
    ModelHttpClients,
    build_http_clients,
    endpoint_refusal,
    provider_for,
)
from pytest_haico.standins.rate_limit import SlidingWindowLimiter
from pytest_haico.standins.snapshots import Pool, SnapshotStore
from pytest_haico.standins.turns import (
    TurnRecording,
    TurnRefusedError,
    aiter_turn_events,
    plan_turn,
)

if TYPE_CHECKING:
    from pytest_haico.standins.backend import BackendSettings

logger = logging.getLogger("pytest_haico.standins.backend")

T = TypeVar("T")

# Every connection of the backend: autocommit, each statement prepared (the checkpointer's
# are the same on every turn), rows as dicts (as the checkpointer reads them).
CONNECTION_OPTIONS: dict[str, Any] = {
    "autocommit": True,
    "prepare_threshold": 0,
    "row_factory": dict_row,
}
# The checkpointer's connection, as pg_stat_activity names it. Lost, it is not replaced: the
# health check answers 503 and the turns fail, as with the database down.
CHECKPOINTER_APPLICATION_NAME = "haico-backend-checkpointer"
# Seconds the pool waits for its first connection, once the database is set up.
POOL_TIMEOUT_S = 30.0


class InlineExecutor(ThreadPoolExecutor):
    """An executor that runs each call at once, in the caller's thread.

    The event loop's default executor in the backend: what reaches it is CPU-bound under
    the GIL (the checkpointer serialising and loading checkpoints with `asyncio.to_thread`,
    LangChain running a sync function or callback with `run_in_executor`), so a thread adds
    no parallelism, only a hop and a GIL hand-over per call (1.5 ms of CPU a turn, measured
    on the graph and its checkpointer in one process).
    A subclass of ThreadPoolExecutor, as asyncio's `set_default_executor` requires; it
    never starts a thread.
    """

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        future: Future[T] = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as exc:
            future.set_exception(exc)
        return future


@dataclass
class _Resources:
    """What the app opens at start-up and closes at shutdown."""

    pool: Pool
    checkpoints: AsyncConnection[DictRow]  # the checkpointer's
    store: SnapshotStore
    http_clients: ModelHttpClients
    agents: AgentCache


class _BackendApp:
    """The request handlers and the resources they share."""

    def __init__(self, settings: BackendSettings, database: Future[None]) -> None:
        self.settings = settings
        self._database = database  # set up in a thread, from before the app was imported
        self.redactor = Redactor(settings.secrets)
        self.limiter = (
            SlidingWindowLimiter(settings.rate_limit_rpm) if settings.rate_limit_rpm else None
        )
        self._resources: _Resources | None = None
        # Turns of one thread run one at a time (the index is assigned under the lock), so
        # indices never collide; one small lock per thread ever seen is a stand-in's budget.
        self._thread_locks: dict[str, asyncio.Lock] = {}

    @property
    def resources(self) -> _Resources:
        assert self._resources is not None, "used before start-up"
        return self._resources

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        asyncio.get_running_loop().set_default_executor(InlineExecutor())
        pool: Pool = AsyncConnectionPool(
            self.settings.database_url,
            connection_class=AsyncConnection[DictRow],
            kwargs=CONNECTION_OPTIONS,
            min_size=1,
            max_size=10,
            open=False,
        )
        http_clients = build_http_clients()
        checkpoints: AsyncConnection[DictRow] | None = None
        try:
            # Before the wait: while the stack is still starting Postgres, it costs no time.
            warm_up(AsyncPostgresSaver(pool), http_clients=http_clients)
            await asyncio.wrap_future(self._database)
            await pool.open(wait=True, timeout=POOL_TIMEOUT_S)
            # The checkpointer's own connection: it holds a lock of its own around every
            # statement, so a pool gave it no concurrency, only a checkout and a return per
            # statement (1.4 ms of CPU a turn, measured as above). The snapshot rows keep the
            # pool.
            checkpoints = await AsyncConnection.connect(
                self.settings.database_url,
                application_name=CHECKPOINTER_APPLICATION_NAME,
                **CONNECTION_OPTIONS,
            )
            agents = AgentCache(
                AsyncPostgresSaver(checkpoints),
                http_clients=http_clients,
                api_key=self.settings.vllm_api_key,
            )
            self._resources = _Resources(
                pool, checkpoints, SnapshotStore(pool), http_clients, agents
            )
            # What start-up made lives as long as the process: out of the collector's sight,
            # a full collection no longer walks LangGraph's modules and schemas (~0.1 s, a
            # stall of every turn in flight, a few times a campaign). The collector was off
            # since `main` began; its only garbage, the dropped warm-up agent (about 1,800
            # objects), stays frozen rather than cost a full collection here (0.1-0.17 s).
            # It runs again from now on.
            gc.freeze()
            gc.enable()
            logger.info("stand-in backend ready: database set up, checkpointer on Postgres")
            yield
        finally:
            await http_clients.aclose()
            if checkpoints is not None:
                await checkpoints.close()
            await pool.close()

    def _authorized(self, request: Request) -> bool:
        given = request.headers.get("authorization", "").encode()
        return hmac.compare_digest(given, f"Bearer {self.settings.admin_token}".encode())

    @staticmethod
    def _unauthorized() -> JSONResponse:
        return JSONResponse(
            {"detail": "missing or invalid admin token"},
            status_code=401,
            headers={"WWW-Authenticate": "Bearer"},
        )

    async def health(self, request: Request) -> Response:
        if not self._authorized(request):
            return self._unauthorized()
        try:
            await self.resources.store.ping()
        except Exception as exc:
            return self._unavailable(f"database unreachable: {exc}")
        if self.resources.checkpoints.closed:
            return self._unavailable("the checkpointer's database connection was lost")
        return JSONResponse({"status": "ok"})

    def _unavailable(self, detail: str) -> JSONResponse:
        detail = self.redactor.redact(detail)
        return JSONResponse({"status": "unavailable", "detail": detail}, status_code=503)

    async def query(self, request: Request) -> Response:
        if not self._authorized(request):
            return self._unauthorized()
        if self.limiter is not None and (retry_after := self.limiter.admit()) is not None:
            return JSONResponse(
                {"detail": f"rate limit of {self.settings.rate_limit_rpm} queries per minute"},
                status_code=429,
                headers={"Retry-After": str(retry_after)},
            )
        try:
            body = QueryRequest.model_validate_json(await request.body())
        except ValidationError as exc:
            return JSONResponse({"detail": f"invalid query: {exc}"}, status_code=422)
        model_config = body.config.model
        refusal = endpoint_refusal(model_config.endpoint_url)
        if refusal is not None:
            return JSONResponse({"detail": refusal}, status_code=400)
        resources = self.resources
        graph = resources.agents.get(model_config)
        try:
            plan = await plan_turn(body, graph=graph, store=resources.store)
        except TurnRefusedError as exc:
            return JSONResponse({"detail": str(exc)}, status_code=400)
        recording = TurnRecording(
            provider=provider_for(model_config.endpoint_url),
            model_id=self.settings.substitute_model or model_config.model_id,
            recursion_flag=self.settings.recursion_flag,
            redactor=self.redactor,
        )
        lock = self._thread_locks.setdefault(plan.thread_id, asyncio.Lock())

        async def aiter_sse() -> AsyncIterator[str]:
            async with lock:
                try:
                    async for event in aiter_turn_events(
                        plan,
                        query=body.query,
                        recursion_limit=body.config.agent.recursion_limit,
                        graph=graph,
                        store=resources.store,
                        recording=recording,
                    ):
                        yield sse_data(event)
                except Exception as exc:
                    logger.exception("a turn of thread %s failed", plan.thread_id)
                    message = self.redactor.redact(f"{type(exc).__name__}: {exc}")
                    yield sse_data(error_event("internal", message))

        return StreamingResponse(
            aiter_sse(),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )


def build_app(settings: BackendSettings, database: Future[None]) -> Starlette:
    """The ASGI app: ``GET /api/health`` and ``POST /api/query/stream_steps/sse``; its
    start-up waits for *database*, the outcome of `start_database_setup`."""
    handlers = _BackendApp(settings, database)
    return Starlette(
        routes=[
            Route("/api/health", handlers.health, methods=["GET"]),
            Route("/api/query/stream_steps/sse", handlers.query, methods=["POST"]),
        ],
        lifespan=handlers.lifespan,
    )
