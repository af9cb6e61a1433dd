"""The loopback stack: service processes, ports, Postgres, the janitor and the profiles."""

from __future__ import annotations

from pytest_haico.stack.janitor import Reaped, Registry, ServiceRecord, reap_orphans
from pytest_haico.stack.local import build_local_stack
from pytest_haico.stack.orchestrator import Orchestrator, ServiceTiming
from pytest_haico.stack.pgbinaries import embedded_bin_dir
from pytest_haico.stack.ports import PortPool, derive_base_port, is_port_free, reap_stale_claims
from pytest_haico.stack.postgres import PostgresBinaries, PostgresService, find_postgres_binaries
from pytest_haico.stack.profiles import HttpService, Stack
from pytest_haico.stack.request import BackendCommand, ModelEndpoint, StackRequest
from pytest_haico.stack.service import (
    Command,
    Service,
    ServiceProcess,
    new_secret,
)

__all__ = [
    "BackendCommand",
    "Command",
    "HttpService",
    "ModelEndpoint",
    "Orchestrator",
    "PortPool",
    "PostgresBinaries",
    "PostgresService",
    "Reaped",
    "Registry",
    "Service",
    "ServiceProcess",
    "ServiceRecord",
    "ServiceTiming",
    "Stack",
    "StackRequest",
    "build_local_stack",
    "derive_base_port",
    "embedded_bin_dir",
    "find_postgres_binaries",
    "is_port_free",
    "new_secret",
    "reap_orphans",
    "reap_stale_claims",
]
