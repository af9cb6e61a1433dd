"""Fixtures shared by pytest-haico's own tests."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

# httpx imports httpcore on first use and keeps a map of the httpcore exception classes it
# met first. pytester restores sys.modules after each in-process run: if httpcore were first
# imported inside one, a later test would get a second copy whose errors (a backend killed
# mid-stream) escape httpx unmapped. Importing it here, before any run, keeps one copy.
# numpy (under pandas and matplotlib) is imported here too: pytester also drops what a test
# imported, and numpy refuses a second load into one process, so a test using pytester that
# imported it first (whichever runs first on an xdist worker) would break every later one.
import httpcore  # noqa: F401
import numpy  # noqa: F401
import pytest

# matplotlib likewise: a second load of its artists (pyplot first imported inside a
# pytester run) makes two PolyCollection classes, and its docstrings' lookup fails.
with contextlib.suppress(ImportError):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot

# scipy.stats (the paired statistics) likewise: it loads numpy's lazily imported C
# extensions (numpy.fft's), which refuse a second load as numpy does.
with contextlib.suppress(ImportError):
    import scipy.stats  # noqa: F401

from pytest_haico.stack import Orchestrator, PostgresService
from tests.harness import CampaignProject, clear_campaign_environment
from tests.standins.standin_procs import BackendServers, Launcher, LlmServers

Mount = Callable[..., Path]


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


@pytest.fixture
def tmpfs() -> Iterator[Mount]:
    """`tmpfs(path, size="64k", read_only=False)` mounts a small tmpfs at `path` (root only);
    every mount is undone at teardown."""
    mounted: list[Path] = []

    def mount(path: Path, *, size: str = "64k", read_only: bool = False) -> Path:
        if os.geteuid() != 0:
            pytest.skip("mounting a tmpfs needs root")
        path.mkdir(parents=True, exist_ok=True)
        options = f"size={size},mode=0755" + (",ro" if read_only else "")
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
        mounted.append(path)
        return path

    yield mount
    for path in reversed(mounted):
        # Lazy: a file a failed run left open must not keep the mount.
        subprocess.run(["umount", "--lazy", str(path)], check=False)


@pytest.fixture
def umask() -> Iterator[None]:
    """Restores the umask a test sets."""
    old = os.umask(0o022)
    os.umask(old)
    yield
    os.umask(old)
