"""Ordered start, reverse stop, retries on a taken port, exactly-once stop."""

from __future__ import annotations

import os
import signal
import socket
import stat
import tempfile
import threading
import time
from pathlib import Path

import pytest

from pytest_haico.errors import StackError
from pytest_haico.procfs import is_alive
from pytest_haico.stack import HttpService, Orchestrator, PostgresService
from pytest_haico.stack.janitor import RegistryFile
from tests.stack.stack_helpers import tiny


class _Recorded(HttpService):
    """Records the order in which the orchestrator cleans services up."""

    order: list[str]

    def cleanup(self) -> None:
        self.order.append(self.name)


def _recorded(name: str, order: list[str], requires: tuple[str, ...] = ()) -> HttpService:
    base = tiny(name, requires=requires)
    service = _Recorded(name=name, argv=base.argv, requires=requires)
    service.order = order
    return service


def test_services_start_in_waves_and_stop_in_waves_dependents_first(tmp_path: Path) -> None:
    cleaned: list[str] = []
    db = _recorded("db", cleaned)
    model = _recorded("model", cleaned)
    app = _recorded("app", cleaned, requires=("db",))
    mirror = tmp_path / "run" / "services.json"
    stack = Orchestrator(
        [model, db, app],
        tmp_path / "logs",
        state_dir=tmp_path,
        registry_mirror=mirror,
        reap=False,
    )
    with stack:
        procs = stack.processes
        # Independent services are spawned before either is polled healthy ...
        assert (procs["db"].spawned_at or 0) < (procs["model"].healthy_at or 0)
        # ... and a dependent one only once its requirement answers.
        assert (procs["app"].spawned_at or 0) >= (procs["db"].healthy_at or 0)
        assert set(stack.timings) == {"db", "model", "app"}
        assert all(t.healthy > 0 and t.attempts == 1 for t in stack.timings.values())
        assert len({p.port for p in procs.values()}) == 3
        registry = tmp_path / "services"
        assert len(list(registry.glob("*.json"))) == 1
        recorded = RegistryFile.model_validate_json(mirror.read_text())
        assert {(r.name, r.pid, r.port) for r in recorded.services} == {
            (name, p.pid, p.port) for name, p in procs.items()
        }
    # First what nothing waits for, side by side (app, model), then what app required (db).
    assert cleaned == ["app", "model", "db"]
    assert RegistryFile.model_validate_json(mirror.read_text()).services == []
    assert not any(is_alive(p.pid or 0) for p in procs.values())
    assert list(registry.glob("*.json")) == []


def test_stop_runs_exactly_once(tmp_path: Path) -> None:
    cleaned: list[str] = []
    stack = Orchestrator(
        [_recorded("web", cleaned)], tmp_path / "logs", state_dir=tmp_path, reap=False
    )
    stack.start()
    stack.stop()
    stack.stop()
    assert cleaned == ["web"]
    with pytest.raises(StackError, match="already started"):
        stack.start()


def test_port_taken_between_claim_and_bind_is_retried_on_another_port(tmp_path: Path) -> None:
    squatters: list[socket.socket] = []

    def squat(port: int) -> None:
        # A co-tenant binds the port after our claim, while the service is starting.
        if not squatters:
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers do
            sock.bind(("127.0.0.1", port))
            sock.listen()
            squatters.append(sock)

    service = tiny(argv_hook=squat)
    try:
        with Orchestrator([service], tmp_path / "logs", state_dir=tmp_path, reap=False) as stack:
            taken = squatters[0].getsockname()[1]
            assert stack.port("web") != taken
            assert stack.timings["web"].attempts == 2
            # The probe never went to the co-tenant's socket.
            squatters[0].setblocking(False)
            with pytest.raises(BlockingIOError):
                squatters[0].accept()
        log = (tmp_path / "logs" / "web.log").read_text()
        assert "Address already in use" in log
    finally:
        for sock in squatters:
            sock.close()


def test_unknown_or_late_requirement_is_refused_before_anything_starts(tmp_path: Path) -> None:
    with pytest.raises(StackError, match=r"app requires \['db'\], which must be listed before it"):
        Orchestrator([tiny("app", requires=("db",)), tiny("db")], tmp_path)
    late = HttpService(name="app", argv=tiny().argv, waits_for=("db",))
    with pytest.raises(StackError, match=r"app waits for \['db'\], which must be listed before"):
        Orchestrator([late, tiny("db")], tmp_path)


class _PreparesUntil(HttpService):
    """Its prepare blocks until `released` is set."""

    released: threading.Event

    def prepare(self, log_path: Path) -> None:
        if not self.released.wait(10):
            raise StackError(f"{self.name}: prepare was never released")


class _Releases(HttpService):
    """Sets `released` once healthy."""

    released: threading.Event

    def on_healthy(self, port: int) -> None:
        self.released.set()


def test_a_slow_prepare_does_not_hold_back_the_other_services(tmp_path: Path) -> None:
    # The slow one comes first and is released only by the other one being healthy: a
    # prepare run in line would wait for it in vain.
    released = threading.Event()
    slow = _PreparesUntil(name="slow", argv=tiny().argv)
    fast = _Releases(name="fast", argv=tiny().argv)
    slow.released = fast.released = released
    with Orchestrator([slow, fast], tmp_path / "logs", state_dir=tmp_path, reap=False) as stack:
        procs = stack.processes
        assert (procs["fast"].healthy_at or 0) < (procs["slow"].spawned_at or 0)
        slow_timing, fast_timing = stack.timings["slow"], stack.timings["fast"]
        assert slow_timing.launched + slow_timing.prepare >= fast_timing.ready


class _SleepsInPrepare(HttpService):
    seconds: float

    def prepare(self, log_path: Path) -> None:
        time.sleep(self.seconds)


def test_a_service_that_waits_for_another_starts_alongside_it_but_is_healthy_after_it(
    tmp_path: Path,
) -> None:
    db = _SleepsInPrepare(name="db", argv=tiny().argv)
    db.seconds = 1.0
    app = HttpService(name="app", argv=tiny().argv, waits_for=("db",))
    with Orchestrator([db, app], tmp_path / "logs", state_dir=tmp_path, reap=False) as stack:
        procs = stack.processes
        # Spawned while db was still preparing; app answers at once, but counts only after db.
        assert (procs["app"].spawned_at or 0) < (procs["db"].spawned_at or 0)
        assert (procs["app"].healthy_at or 0) >= (procs["db"].healthy_at or 0)
        assert stack.timings["app"].ready >= stack.timings["db"].ready >= 1.0
        assert all(t.attempts == 1 for t in stack.timings.values())


def test_a_service_that_waits_for_one_that_moves_port_is_respawned_with_the_new_port(
    tmp_path: Path,
) -> None:
    squatters: list[socket.socket] = []
    seen: list[int] = []  # db's port, as app was told at each of its spawns

    def squat(port: int) -> None:
        if not squatters:
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("127.0.0.1", port))
            sock.listen()
            squatters.append(sock)

    def app_argv(port: int) -> list[str]:
        seen.append(stack.port("db"))
        return list(tiny().argv(port))

    db = tiny("db", argv_hook=squat)
    app = HttpService(name="app", argv=app_argv, waits_for=("db",))
    stack = Orchestrator([db, app], tmp_path / "logs", state_dir=tmp_path, reap=False)
    try:
        with stack:
            taken = squatters[0].getsockname()[1]
            assert seen == [taken, stack.port("db")]
            assert stack.port("db") != taken
            assert (stack.timings["db"].attempts, stack.timings["app"].attempts) == (2, 2)
    finally:
        for sock in squatters:
            sock.close()


class _StopsOnPrepare(HttpService):
    """Stops its own stack from prepare(), as a signal handler could mid-start."""

    stack: Orchestrator

    def prepare(self, log_path: Path) -> None:
        self.stack.stop()


class _SlowToPrepare(HttpService):
    """Records when its (slow) prepare ends and when it is cleaned up."""

    events: list[str]

    def prepare(self, log_path: Path) -> None:
        time.sleep(1.0)
        self.events.append("prepared")

    def cleanup(self) -> None:
        self.events.append("cleaned")


class _StopsWhenHealthy(HttpService):
    """Stops its own stack once healthy, as a signal handler could mid-start."""

    stack: Orchestrator

    def on_healthy(self, port: int) -> None:
        self.stack.stop()


def test_stop_while_a_service_prepares_cleans_it_up_only_after_its_prepare(
    tmp_path: Path,
) -> None:
    slow = _SlowToPrepare(name="slow", argv=tiny().argv)
    slow.events = []
    trigger = _StopsWhenHealthy(name="trigger", argv=tiny().argv)
    stack = Orchestrator([slow, trigger], tmp_path / "logs", state_dir=tmp_path, reap=False)
    trigger.stack = stack
    with pytest.raises(StackError, match="the stack was stopped while starting slow"):
        stack.start()
    assert slow.events == ["prepared", "cleaned"]
    assert not any(is_alive(p.pid or 0) for p in stack.processes.values())
    assert list((tmp_path / "ports").glob("*.json")) == []
    assert list((tmp_path / "services").glob("*.json")) == []


def test_stop_during_start_leaves_nothing_running(tmp_path: Path) -> None:
    first = tiny("first")
    late = _StopsOnPrepare(name="late", argv=tiny().argv, requires=("first",))
    stack = Orchestrator([first, late], tmp_path / "logs", state_dir=tmp_path, reap=False)
    late.stack = stack
    with pytest.raises(StackError, match="the stack was stopped while starting late"):
        stack.start()
    assert not any(is_alive(p.pid or 0) for p in stack.processes.values())
    assert list((tmp_path / "ports").glob("*.json")) == []
    assert list((tmp_path / "services").glob("*.json")) == []


class _KilledOnceHealthy(PostgresService):
    """Postgres that gets SIGKILL the moment it is healthy (passwords set)."""

    stack: Orchestrator

    def on_healthy(self, port: int) -> None:
        super().on_healthy(port)
        pid = self.stack.processes[self.name].pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)


def test_a_service_that_dies_while_another_waits_for_it_fails_the_start_at_once(
    tmp_path: Path,
) -> None:
    postgres = _KilledOnceHealthy()
    # Waits for Postgres, like the stand-in backend, and never answers by itself.
    backend = HttpService(
        name="backend",
        argv=tiny(mode="unhealthy").argv,
        waits_for=("postgres",),
        start_timeout=20,
    )
    stack = Orchestrator([postgres, backend], tmp_path / "logs", state_dir=tmp_path, reap=False)
    postgres.stack = stack
    with pytest.raises(StackError) as caught:
        stack.start()
    message = str(caught.value)  # the death, not the backend's timeout 20 s on
    pid, port = stack.processes["postgres"].pid, stack.port("postgres")
    assert message.startswith(
        f"postgres exited with status -9 while backend was starting (pid {pid}, port {port}, "
        f"attempt 1); last lines of {tmp_path / 'logs' / 'postgres.log'}:\n"
    )
    assert "database system is ready to accept connections" in message
    assert not any(is_alive(p.pid or 0) for p in stack.processes.values())
    assert list((tmp_path / "services").glob("*.json")) == []


def test_a_service_with_a_scratch_directory_gets_a_private_one_removed_at_its_stop(
    tmp_path: Path,
) -> None:
    service = tiny("model")
    service.scratch_env = "TMPDIR"
    mirror = tmp_path / "run" / "services.json"
    with Orchestrator(
        [service], tmp_path / "logs", state_dir=tmp_path, registry_mirror=mirror, reap=False
    ) as stack:
        scratch = service.scratch_dir
        assert scratch is not None and scratch.parent == Path(tempfile.gettempdir())
        info = os.lstat(scratch)
        assert (stat.S_IMODE(info.st_mode), info.st_uid) == (0o700, os.getuid())
        environ = Path(f"/proc/{stack.processes['model'].pid}/environ").read_bytes()
        assert f"TMPDIR={scratch}".encode() in environ.split(b"\0")
        # Recorded for the janitor, should this process die before the stop.
        (recorded,) = RegistryFile.model_validate_json(mirror.read_text()).services
        assert recorded.cleanup == (str(scratch),)
        (scratch / "engine.sock").touch()  # what a process killed by SIGKILL leaves
    assert not scratch.exists()
    assert service.scratch_dir is None and service.cleanup_paths == ()
