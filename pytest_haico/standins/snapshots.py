"""The backend's database: the checkpointer's tables and ``workspace_snapshots`` (a row a turn)."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, LiteralString

import psycopg
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from psycopg import AsyncConnection
from psycopg.rows import DictRow, dict_row
from psycopg_pool import AsyncConnectionPool

Pool = AsyncConnectionPool[AsyncConnection[DictRow]]

# Serialises schema set-up when several backends start against one database at once
# (CREATE TABLE IF NOT EXISTS is not safe against a concurrent twin).
_SETUP_LOCK_KEY = 0x6861_6963_6F32  # "haico2"
# A branch of a branch of ...: far deeper than any script, shallow enough to stop a cycle.
_MAX_LINEAGE = 64
# Between connection attempts while the database is not up yet.
_WAIT_INTERVAL_S = 0.05

SNAPSHOTS_DDL = """
CREATE TABLE IF NOT EXISTS workspace_snapshots (
    snapshot_id       uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    thread_id         text NOT NULL,
    turn_index        integer NOT NULL,
    branch_from       integer,
    parent_thread_id  text,
    checkpoint_id     text,
    provider          text NOT NULL,
    model_id          text NOT NULL,
    outcome           text NOT NULL,
    error_kind        text,
    tokens_in         integer NOT NULL DEFAULT 0,
    tokens_out        integer NOT NULL DEFAULT 0,
    created_at        timestamptz NOT NULL DEFAULT now(),
    UNIQUE (thread_id, turn_index)
)
"""


@dataclass(frozen=True)
class Snapshot:
    """One row of ``workspace_snapshots``.

    ``branch_from`` and ``parent_thread_id`` are set on the first turn of a branch thread:
    the turn forked from turn ``branch_from`` of ``parent_thread_id``. ``outcome`` is
    "complete" or "error" (then ``error_kind`` is the error event's kind). The row's
    ``checkpoint_id`` is the thread's newest checkpoint when the row is written.
    """

    thread_id: str
    turn_index: int
    branch_from: int | None
    parent_thread_id: str | None
    provider: str
    model_id: str
    outcome: str
    error_kind: str | None
    tokens_in: int
    tokens_out: int


@dataclass(frozen=True)
class TurnCheckpoint:
    """Where the state after a turn is: a thread and the checkpoint id that ended the turn."""

    thread_id: str
    checkpoint_id: str


async def wait_for_database(conninfo: str, *, timeout: float) -> None:
    """Return once *conninfo* accepts a connection; raise the last error after *timeout* s.

    The stack may start the backend before its Postgres listens, or before it has the
    run's password; the pool's own retries would wait a second after the first failure.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        try:
            connection = await AsyncConnection.connect(conninfo, connect_timeout=5)
        except psycopg.OperationalError:
            if loop.time() >= deadline:
                raise
            await asyncio.sleep(_WAIT_INTERVAL_S)
        else:
            await connection.close()
            return


async def setup_database(conninfo: str, *, timeout: float) -> None:
    """Wait for the database, then create or migrate the checkpointer's tables and
    ``workspace_snapshots``, on a connection of its own."""
    await wait_for_database(conninfo, timeout=timeout)
    connection = await AsyncConnection.connect(
        conninfo, autocommit=True, prepare_threshold=0, row_factory=dict_row
    )
    async with connection as conn:
        await conn.execute("SELECT pg_advisory_lock(%s)", (_SETUP_LOCK_KEY,))
        try:
            await AsyncPostgresSaver(conn).setup()
            await conn.execute(SNAPSHOTS_DDL)
        finally:
            await conn.execute("SELECT pg_advisory_unlock(%s)", (_SETUP_LOCK_KEY,))


def start_database_setup(conninfo: str, *, timeout: float) -> Future[None]:
    """`setup_database` in a thread of its own, from now on; its outcome.

    Started before the backend imports LangGraph and its model client (over a second of
    CPU, in the main thread), the wait for a Postgres still starting and the migrations
    (a commit each) overlap that import instead of following it. The thread imports
    nothing: everything it runs is imported with this module.
    """
    outcome: Future[None] = Future()

    def run() -> None:
        try:
            asyncio.run(setup_database(conninfo, timeout=timeout))
        except BaseException as exc:
            outcome.set_exception(exc)
        else:
            outcome.set_result(None)

    threading.Thread(target=run, name="database-setup", daemon=True).start()
    return outcome


class SnapshotStore:
    """Reads and writes ``workspace_snapshots``.

    It remembers each thread's next turn index from the rows it wrote: this process is the
    table's only writer, and a thread's turns run one at a time. A thread it has not
    written to since it started is looked up.
    """

    def __init__(self, pool: Pool) -> None:
        self._pool = pool
        self._next_index: dict[str, int] = {}

    async def ping(self) -> None:
        """Raise unless the database answers."""
        async with self._pool.connection() as conn:
            await conn.execute("SELECT 1")

    async def next_turn_index(self, thread_id: str) -> int:
        """The index of the thread's next turn (a branch thread continues its parent's count)."""
        if (known := self._next_index.get(thread_id)) is not None:
            return known
        row = await self._one(
            "SELECT max(turn_index) AS last FROM workspace_snapshots WHERE thread_id = %s",
            (thread_id,),
        )
        last = row["last"] if row else None
        return 0 if last is None else int(last) + 1

    async def find_turn(self, thread_id: str, turn_index: int) -> TurnCheckpoint | None:
        """The checkpoint that ended turn *turn_index* as seen from *thread_id*.

        A branch thread holds only the turns after its fork; earlier ones are looked up in
        the thread it was forked from, and so on up the lineage.
        """
        for _ in range(_MAX_LINEAGE):
            row = await self._one(
                "SELECT checkpoint_id FROM workspace_snapshots"
                " WHERE thread_id = %s AND turn_index = %s",
                (thread_id, turn_index),
            )
            if row is not None:
                checkpoint_id = row["checkpoint_id"]
                return TurnCheckpoint(thread_id, checkpoint_id) if checkpoint_id else None
            fork = await self._one(
                "SELECT parent_thread_id, branch_from FROM workspace_snapshots"
                " WHERE thread_id = %s AND parent_thread_id IS NOT NULL"
                " ORDER BY turn_index LIMIT 1",
                (thread_id,),
            )
            if fork is None or turn_index > int(fork["branch_from"]):
                return None
            thread_id = str(fork["parent_thread_id"])
        return None

    async def record(self, snapshot: Snapshot) -> str:
        """Insert the turn's row, with the thread's newest checkpoint; return its ``snapshot_id``.

        The checkpoint id is read from the checkpointer's own table in the same statement,
        as ``aget_tuple`` finds the newest one (``ORDER BY checkpoint_id DESC``), without
        loading and decoding the state that ``aget_state`` would.
        """
        row = await self._one(
            "INSERT INTO workspace_snapshots (thread_id, turn_index, branch_from,"
            " parent_thread_id, checkpoint_id, provider, model_id, outcome, error_kind,"
            " tokens_in, tokens_out) VALUES (%(thread_id)s, %(turn_index)s, %(branch_from)s,"
            " %(parent_thread_id)s, (SELECT checkpoint_id FROM checkpoints"
            " WHERE thread_id = %(thread_id)s AND checkpoint_ns = ''"
            " ORDER BY checkpoint_id DESC LIMIT 1), %(provider)s, %(model_id)s, %(outcome)s,"
            " %(error_kind)s, %(tokens_in)s, %(tokens_out)s) RETURNING snapshot_id",
            dataclasses.asdict(snapshot),
        )
        assert row is not None
        self._next_index[snapshot.thread_id] = snapshot.turn_index + 1
        return str(row["snapshot_id"])

    async def _one(
        self, query: LiteralString, params: tuple[Any, ...] | dict[str, Any]
    ) -> DictRow | None:
        async with self._pool.connection() as conn:
            cursor = await conn.execute(query, params)
            return await cursor.fetchone()
