"""Phoenix, the cluster profile's optional tracing (PHOENIX_ENABLED=1): from its image, on
loopback, its working directory private and node-local; its SQLite database is copied into
the run directory at stop."""

from __future__ import annotations

import contextlib
import logging
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

from pytest_haico.files import atomic_file, write_all
from pytest_haico.stack.apptainer import Apptainer, ContainerHttpService
from pytest_haico.stack.ports import PortPool
from pytest_haico.stack.service import Command

logger = logging.getLogger(__name__)

PHOENIX_ARGV = ("python3", "-m", "phoenix.server.main", "serve")  # the image's CMD, spelled out
PHOENIX_START_TIMEOUT_S = 300.0  # its imports and database migrations, from a SIF
PHOENIX_DB = "phoenix.db"  # Phoenix's SQLite database in its working directory
_COPY_CHUNK = 1 << 20


def save_sqlite(source: Path, destination: Path, *, mode: int) -> bool:
    """Copy the SQLite database `source` to `destination`, created with `mode`; False if
    there is no `source`.

    SQLite's backup API (which also reads a write-ahead log a killed writer left behind)
    makes a snapshot next to `source`, node-local: SQLite's locks are not to be trusted on
    a shared file system. The snapshot leaves WAL mode, so that a reader without write
    access to its directory can open the copy; the copy is written whole, then renamed.
    """
    if not source.is_file():
        return False
    snapshot = source.with_name(f"{source.name}.snapshot")
    snapshot.unlink(missing_ok=True)
    with (
        contextlib.closing(sqlite3.connect(source)) as reader,
        contextlib.closing(sqlite3.connect(snapshot)) as writer,
    ):
        reader.backup(writer)
        writer.execute("PRAGMA journal_mode=DELETE")
    try:
        with atomic_file(destination, mode=mode) as out, snapshot.open("rb") as data:
            while chunk := data.read(_COPY_CHUNK):
                write_all(out, chunk)
    finally:
        snapshot.unlink(missing_ok=True)
    return True


@dataclass(kw_only=True)
class PhoenixService(ContainerHttpService):
    """Phoenix in its image. Besides its HTTP port it binds a gRPC collector on every
    interface (PHOENIX_GRPC_PORT, default 4317, which co-tenants would share): each spawn
    claims a port for it from the stack's pool, which releases it at stop."""

    ports: PortPool = field(repr=False)
    grpc_port: int | None = None

    def command(self, port: int) -> Command:
        """A freshly claimed gRPC port (a respawn may follow a co-tenant taking it)."""
        if self.grpc_port is not None:
            self.ports.release(self.grpc_port)
        self.grpc_port = self.ports.claim(f"{self.name}-grpc")
        return super().command(port)

    @property
    def collector_endpoint(self) -> str:
        """Its OTLP HTTP endpoint for traces."""
        return f"{self.url}/v1/traces"


def build_phoenix_service(
    apptainer: Apptainer, *, ports: PortPool, run_dir: Path, file_mode: int
) -> PhoenixService:
    """Phoenix from `apptainer`'s image, as a service named `phoenix` (not yet started):
    its database is copied to `run_dir` at cleanup."""
    phoenix: PhoenixService

    def env() -> dict[str, str]:
        assert phoenix.work_dir is not None  # reserved before the first spawn
        return {
            "PHOENIX_HOST": "127.0.0.1",
            "PHOENIX_GRPC_PORT": str(phoenix.grpc_port),
            "PHOENIX_WORKING_DIR": str(phoenix.work_dir),
            "PHOENIX_TELEMETRY_ENABLED": "false",  # a compute node phones nobody home
        }

    def keep(work_dir: Path) -> None:
        if not save_sqlite(work_dir / PHOENIX_DB, run_dir / PHOENIX_DB, mode=file_mode):
            logger.info("phoenix: no %s in %s to keep", PHOENIX_DB, work_dir)

    phoenix = PhoenixService(
        name="phoenix",
        argv=lambda port: list(PHOENIX_ARGV),
        env=env,
        apptainer=apptainer,
        health_path="/healthz",
        start_timeout=PHOENIX_START_TIMEOUT_S,
        port_env="PHOENIX_PORT",
        work_dir_name="working",
        keep=keep,
        ports=ports,
    )
    return phoenix
