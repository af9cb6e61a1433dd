"""Fixtures shared by pytest-haico's own tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from pytest_haico.stack import Orchestrator, PostgresService
from tests.harness import CampaignProject, clear_campaign_environment


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


@pytest.fixture
def campaign(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> Iterator[CampaignProject]:
    """A campaign project in pytester's directory (no arms or scripts yet; the harness's
    ITEM_MODULE test module), outside any Slurm job; background runs are killed at teardown."""
    clear_campaign_environment(monkeypatch)
    project = CampaignProject(pytester)
    try:
        yield project
    finally:
        project.stop_background_runs()
