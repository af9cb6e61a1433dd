"""Fixtures of the stand-ins' contract tests: real stand-in processes, shared per session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.standins.standin_procs import BackendServers, Launcher, LlmServers


@pytest.fixture(scope="session")
def standin_launcher(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Launcher]:
    """Session-wide cache of running stand-ins, started and stopped by the stack's orchestrator."""
    launcher = Launcher(
        tmp_path_factory.mktemp("standin-logs"), tmp_path_factory.mktemp("standin-state")
    )
    try:
        yield launcher
    finally:
        launcher.stop_all()


@pytest.fixture(scope="session")
def llm_server(standin_launcher: Launcher) -> LlmServers:
    """``llm_server(persona, seed=0, ...)``: a running stand-in vLLM, shared per argument set."""
    return LlmServers(standin_launcher)


@pytest.fixture(scope="session")
def backend_server(standin_launcher: Launcher, postgres_dsn: str) -> BackendServers:
    """``backend_server(rate_limit_rpm=2, ...)``: a running stand-in backend, own database."""
    return BackendServers(standin_launcher, postgres_dsn)
