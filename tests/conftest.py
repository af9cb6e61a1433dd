"""Fixtures shared by pytest-haico's own tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from pytest_haico.stack import Orchestrator, PostgresService


@pytest.fixture(scope="session")
def postgres_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PostgresService]:
    """A real Postgres started by the stack's own orchestrator, for this session."""
    postgres = PostgresService()
    with Orchestrator([postgres], tmp_path_factory.mktemp("postgres-logs")):
        yield postgres


@pytest.fixture(scope="session")
def postgres_dsn(postgres_service: PostgresService) -> str:
    """A superuser DSN (TCP 127.0.0.1, with password) of a real Postgres for this session."""
    return postgres_service.dsn
