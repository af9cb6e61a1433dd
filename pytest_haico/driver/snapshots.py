"""Reading the backend's ``workspace_snapshots`` rows: which provider and model served a turn."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

import psycopg
from psycopg.rows import dict_row

# The provider name the backend records for a turn served by the arm's vLLM.
VLLM_PROVIDER = "vllm"
# Beyond the wait for the row: a hung database must end as an error, not a hang.
_READ_GRACE_S = 10.0

_QUERY = """
SELECT snapshot_id, thread_id, turn_index, branch_from, provider, model_id, created_at
FROM workspace_snapshots
WHERE thread_id = %(thread_id)s AND turn_index = %(turn_index)s
ORDER BY created_at DESC
LIMIT 1
"""


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The columns of one ``workspace_snapshots`` row the harness uses."""

    snapshot_id: str
    thread_id: str
    turn_index: int
    branch_from: int | None
    provider: str | None
    model_id: str | None
    created_at: datetime | None

    def is_served_by(self, *, provider: str, model_id: str) -> bool:
        """Whether the turn was served by exactly this provider and model."""
        return self.provider == provider and self.model_id == model_id


class SnapshotReader(Protocol):
    """Finds the newest snapshot of one turn of one thread (``None`` when there is none yet)."""

    async def read(self, thread_id: str, turn_index: int) -> Snapshot | None: ...


class PostgresSnapshotReader:
    """A `SnapshotReader` over one read-only, autocommit psycopg connection.

    Autocommit keeps the connection from idling inside a transaction between
    turns (that would pin old row versions for the whole campaign). psycopg
    serialises concurrent queries on one connection; the queries are point
    look-ups, so conversations in flight share it.
    """

    def __init__(self, connection: psycopg.AsyncConnection[dict[str, Any]]) -> None:
        self._connection = connection

    @classmethod
    async def connect(cls, dsn: str, *, connect_timeout_s: float = 10.0) -> PostgresSnapshotReader:
        """Open a connection on ``dsn`` that refuses to write."""
        connection = await psycopg.AsyncConnection.connect(
            dsn,
            autocommit=True,
            row_factory=dict_row,
            connect_timeout=max(1, round(connect_timeout_s)),
        )
        try:
            # Session-level, so it holds for autocommit statements too (the
            # connection's read_only attribute only applies to BEGIN blocks).
            await connection.execute("SET default_transaction_read_only = on")
        except BaseException:
            await connection.close()
            raise
        return cls(connection)

    async def read(self, thread_id: str, turn_index: int) -> Snapshot | None:
        cursor = await self._connection.execute(
            _QUERY, {"thread_id": thread_id, "turn_index": turn_index}
        )
        row = await cursor.fetchone()
        return None if row is None else snapshot_from_row(row)

    async def aclose(self) -> None:
        await self._connection.close()


async def read_snapshot(
    reader: SnapshotReader, thread_id: str, turn_index: int, *, wait_s: float
) -> Snapshot | None:
    """The turn's snapshot, polling up to ``wait_s`` for it to appear; `TimeoutError` on a hang.

    The backend may write the row just after it sends ``complete``.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    delay = 0.05
    async with asyncio.timeout_at(deadline + _READ_GRACE_S):
        while True:
            snapshot = await reader.read(thread_id, turn_index)
            remaining = deadline - loop.time()
            if snapshot is not None or remaining <= 0:
                return snapshot
            await asyncio.sleep(min(delay, remaining))
            delay = min(delay * 2, 0.5)


def snapshot_from_row(row: dict[str, Any]) -> Snapshot:
    """A `Snapshot` from a row mapping (ids of any SQL type become strings)."""
    branch_from = row.get("branch_from")
    return Snapshot(
        snapshot_id=str(row["snapshot_id"]),
        thread_id=str(row["thread_id"]),
        turn_index=int(row["turn_index"]),
        branch_from=None if branch_from is None else int(branch_from),
        provider=row.get("provider"),
        model_id=row.get("model_id"),
        created_at=row.get("created_at"),
    )
