"""One service's lifecycle: failed starts, health timeouts, stop escalation, secrets."""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

import pytest

from pytest_haico.errors import StackError
from pytest_haico.procfs import is_alive, iter_session
from pytest_haico.stack import Orchestrator, PortPool, ServiceProcess
from tests.stack.stack_helpers import tiny


def _nothing_left(state_dir: Path, pids: list[int]) -> None:
    assert not any(is_alive(pid) for pid in pids)
    assert not any(any(True for _ in iter_session(pid)) for pid in pids)
    assert list((state_dir / "ports").glob("*.json")) == []
    assert list((state_dir / "services").glob("*.json")) == []


def test_service_that_exits_at_once_raises_with_its_log_tail_and_stops_the_rest(
    tmp_path: Path,
) -> None:
    first = tiny("first")
    broken = tiny("broken", mode="exit", requires=("first",), token="s3cret-token")
    stack = Orchestrator([first, broken], tmp_path / "logs", state_dir=tmp_path, reap=False)
    with pytest.raises(StackError) as caught:
        stack.start()
    message = str(caught.value)
    assert message.startswith("broken exited with status 3 before it was healthy")
    assert f"last lines of {tmp_path / 'logs' / 'broken.log'}" in message
    assert "refusing to start (mode exit, token [REDACTED])" in message
    assert "s3cret-token" not in message
    _nothing_left(tmp_path, [p.pid for p in stack.processes.values() if p.pid])


def test_health_probe_that_never_passes_times_out_and_leaves_nothing_running(
    tmp_path: Path,
) -> None:
    stuck = tiny("stuck", mode="unhealthy", start_timeout=1.0)
    stack = Orchestrator([stuck], tmp_path / "logs", state_dir=tmp_path, reap=False)
    with pytest.raises(StackError, match=r"^stuck was not healthy within 1 s") as caught:
        stack.start()
    assert "tiny_service: listening on" in str(caught.value)
    _nothing_left(tmp_path, [stack.processes["stuck"].pid or 0])


def test_stop_escalates_to_sigkill_for_a_process_ignoring_sigterm(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pool = PortPool(tmp_path)
    process = ServiceProcess(tiny(mode="ignore-term"), pool.claim("web"), tmp_path / "web.log")
    process.spawn()
    process.wait_healthy()
    with caplog.at_level(logging.WARNING):
        process.stop(grace=0.5)
    assert process.exit_status() == -9
    assert not is_alive(process.pid or 0)
    assert "still running 0.5 s after SIGTERM; killing its process group" in caplog.text
    process.stop()  # idempotent
    pool.release_all()


def test_secrets_reach_the_service_through_its_environment_only(tmp_path: Path) -> None:
    token = "tok-" + "x" * 20
    service = tiny(token=token)
    with Orchestrator([service], tmp_path / "logs", state_dir=tmp_path, reap=False) as stack:
        pid = stack.processes["web"].pid
        assert token.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes()
        assert token.encode() in Path(f"/proc/{pid}/environ").read_bytes()
    assert token not in (tmp_path / "logs" / "web.log").read_text()


def test_spawn_refuses_threads_other_than_main(tmp_path: Path) -> None:
    errors: list[BaseException] = []
    process = ServiceProcess(tiny(), 1, tmp_path / "web.log")

    def spawn() -> None:
        try:
            process.spawn()
        except StackError as exc:
            errors.append(exc)

    thread = threading.Thread(target=spawn)
    thread.start()
    thread.join()
    assert [str(e) for e in errors] == ["web: services must be spawned from the main thread"]


@pytest.mark.parametrize("log_mode", [0o640, 0o644])
def test_service_logs_and_the_registry_mirror_get_the_results_mode_whatever_the_umask(
    tmp_path: Path, log_mode: int
) -> None:
    old_umask = os.umask(0o000)
    try:
        stack = Orchestrator(
            [tiny("web")],
            tmp_path / "logs",
            state_dir=tmp_path / "state",
            registry_mirror=tmp_path / "services.json",
            log_mode=log_mode,
            reap=False,
        )
        with stack:
            mirror_mode = (tmp_path / "services.json").stat().st_mode & 0o777
    finally:
        os.umask(old_umask)
    assert (tmp_path / "logs" / "web.log").stat().st_mode & 0o777 == log_mode
    assert mirror_mode == log_mode
