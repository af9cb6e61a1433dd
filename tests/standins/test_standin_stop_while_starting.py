"""A stand-in stopped while it starts ends at once, instead of finishing its start-up first
(the backend would wait up to a minute for a database the same stop is taking down)."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.standins.standin_http import ADMIN_TOKEN
from tests.standins.standin_procs import base_env, free_port, wait_for_log

# Each test runs a child process (the fast loop, `-m "not slow"`, leaves them out).
pytestmark = pytest.mark.subprocess

# Longer than the signal's effect may take, far shorter than the backend's 60-s database wait.
_EXIT_BOUND_S = 30


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
def test_a_backend_waiting_for_its_database_exits_at_once_on_a_signal(
    tmp_path: Path, stop_signal: signal.Signals
) -> None:
    log_path = tmp_path / "backend.log"
    nowhere = f"host=127.0.0.1 port={free_port()} dbname=haico user=haico password=not-the-one"
    env = base_env() | {"ADMIN_DEFAULT_API_TOKEN": ADMIN_TOKEN, "HAICO_DATABASE_URL": nowhere}
    command = [sys.executable, "-m", "pytest_haico.standins.backend", "--port", str(free_port())]
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for_log(log_path, "Waiting for application startup.", timeout=120)
        process.send_signal(stop_signal)
        code = process.wait(timeout=_EXIT_BOUND_S)
    finally:
        process.kill()
        process.wait()
    text = log_path.read_text()
    assert code == 0, text
    assert "Application startup failed" not in text
    assert "Traceback" not in text
