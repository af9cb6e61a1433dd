"""Ordered, leak-proof start and exactly-once stop of a set of services."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from pytest_haico.errors import PortInUseError, StackError
from pytest_haico.files import create_file, make_dirs
from pytest_haico.stack.janitor import Registry, ServiceRecord, reap_orphans
from pytest_haico.stack.ports import PortPool
from pytest_haico.stack.preparation import Preparation
from pytest_haico.stack.service import Service, ServiceProcess
from pytest_haico.stack.service_order import check_order, dependents, stop_waves

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServiceTiming:
    """Where a service's start-up time went, in seconds."""

    prepare: float  # e.g. the Postgres template copy; overlaps the other services' start-up
    healthy: float  # spawn of the successful attempt → healthy
    attempts: int  # 1 unless its port (or that of a service it waits for) was taken under it
    launched: float = 0.0  # the stack's start → this service's launch (port claimed, prepare on)
    ready: float = 0.0  # the stack's start → healthy


class Orchestrator:
    """Starts services in dependency order, in parallel where allowed; stops them in reverse.

    Launching a service claims its port, has it `reserve` its directories (recorded in
    the registry at once) and runs its `prepare` in a worker thread, so a slow
    preparation overlaps the other services' start-up; the service is spawned (from
    this thread) once it is prepared. A service is launched once every service it
    `requires` is healthy, and once every service it `waits_for` is launched: the latter
    is spawned while those still start, but counts as healthy only after they do, and is
    respawned if one of them has to move to another port. Services spawned together are
    polled together; one that was healthy and died meanwhile fails the start at once,
    named with its log. Before anything starts, the janitor reaps orphans of dead
    sessions on this node.
    """

    def __init__(
        self,
        services: Sequence[Service],
        log_dir: Path,
        *,
        state_dir: Path | None = None,
        ports: PortPool | None = None,
        registry_mirror: Path | None = None,
        log_mode: int = 0o640,
        stop_grace: float = 10.0,
        max_port_attempts: int = 5,
        poll_interval: float = 0.05,
        reap: bool = True,
    ) -> None:
        check_order(services)
        self.services = tuple(services)
        self.log_dir = log_dir
        self.log_mode = log_mode  # the results' file mode: logs sit in the run directory
        self._state_dir = state_dir
        self._ports = ports if ports is not None else PortPool(state_dir)
        self._registry_mirror = registry_mirror
        self._registry: Registry | None = None
        self._stop_grace = stop_grace
        self._max_port_attempts = max_port_attempts
        self._poll = poll_interval
        self._reap = reap
        self._began = 0.0  # monotonic time of start()
        self._wake = threading.Event()  # set when a preparation ends
        self._preparations: dict[str, Preparation] = {}
        self._ports_of: dict[str, int] = {}  # name → claimed port, from launch on
        self._processes: dict[str, ServiceProcess] = {}
        self._healthy: set[str] = set()
        self._timings: dict[str, ServiceTiming] = {}
        self._cleaned: set[str] = set()
        self._lock = threading.RLock()  # stop() may come from a prepare, mid-start()
        self._started = False
        self._stopped = False
        self._interrupted: str | None = None  # why start() must end at its next step

    @property
    def processes(self) -> Mapping[str, ServiceProcess]:
        """The current process of each spawned service (pid, port, log path)."""
        return dict(self._processes)

    @property
    def timings(self) -> Mapping[str, ServiceTiming]:
        """Per healthy service: prepare and spawn → healthy seconds, attempts, offsets."""
        return dict(self._timings)

    def port(self, name: str) -> int:
        """The port `name` listens on, or will: known from its launch on, before its spawn."""
        try:
            return self._ports_of[name]
        except KeyError:
            raise StackError(f"{name} has no port yet: it was not launched") from None

    def log_path(self, name: str) -> Path:
        """Where `name` logs."""
        return self.log_dir / f"{name}.log"

    def start(self) -> None:
        """Start everything or nothing: on any failure, stop what started, then raise."""
        with self._lock:
            if self._started:
                raise StackError("this stack was already started")
            self._started = True
        self._began = time.monotonic()
        try:
            if self._reap:
                reap_orphans(self._state_dir)
            self._registry = Registry(
                self._state_dir,
                mirror=self._registry_mirror,
                mirror_mode=self.log_mode,
                job=self._ports.job,
            )
            self._start_all()
        except BaseException:
            self._stop(quiet=True)
            raise

    def _record(self, service: Service, process: ServiceProcess | None) -> None:
        if self._registry is None or self._stopped:  # a stopped stack's registry is closed
            return
        self._registry.record(
            ServiceRecord(
                name=service.name,
                pid=process.pid if process else None,
                pgid=process.pid if process else None,  # start_new_session: pid = group id
                start_time=process.start_time if process else None,
                uid=process.uid if process else None,
                port=process.port if process else None,
                log=str(self.log_path(service.name)),
                cleanup=tuple(str(path) for path in service.cleanup_paths),
            )
        )

    def interrupt(self, reason: str) -> None:
        """End a `start()` in progress at its next step (within a poll interval) with a
        `StackError`, stopping what it started. Safe from a signal handler: it only sets a
        flag, so nothing is raised into whatever the main thread was doing."""
        self._interrupted = reason

    def _abort_if_stopped(self) -> None:
        if self._interrupted is not None:
            raise StackError(f"{self._interrupted}: the stack was stopped while starting")
        # stop() may come while start() runs (from a prepare, another thread): whatever was
        # launched since, or was still preparing then, must not outlive that.
        if not self._stopped:
            return
        starting = [s.name for s in self.services if s.name in self._preparations]
        starting = [name for name in starting if name not in self._healthy]
        self._release_all()
        raise StackError(f"the stack was stopped while starting {', '.join(starting)}")

    def _is_launchable(self, service: Service) -> bool:
        return set(service.requires) <= self._healthy and set(service.waits_for) <= set(
            self._ports_of
        )

    def _launch(self, service: Service) -> None:
        port = self._ports.claim(service.name)
        self._ports_of[service.name] = port
        # Recorded before prepare fills them: a kill -9 mid-copy leaves them to the janitor.
        service.reserve()
        try:
            self._record(service, None)
        except BaseException:
            service.cleanup()
            raise
        log_path = self.log_path(service.name)
        _create_log(log_path, self.log_mode)
        self._preparations[service.name] = Preparation(service, log_path, self._wake)

    def _spawn(self, service: Service, attempt: int) -> ServiceProcess:
        process = ServiceProcess(
            service, self._ports_of[service.name], self.log_path(service.name), attempt=attempt
        )
        self._processes[service.name] = process
        process.spawn()
        self._abort_if_stopped()
        self._record(service, process)
        return process

    def _relaunch(self, failed: ServiceProcess, error: PortInUseError) -> list[ServiceProcess]:
        """`failed` on a new port, and whatever waits for it respawned with that port."""
        name = failed.service.name
        failed.stop(grace=self._stop_grace)
        self._ports.release(failed.port)
        if failed.attempt >= self._max_port_attempts:
            raise StackError(f"gave up after {failed.attempt} taken ports: {error}") from error
        logger.warning(
            "%s: port %d was taken before it could bind; retrying on another port",
            name,
            failed.port,
        )
        self._ports_of[name] = self._ports.claim(name)
        respawned = [self._spawn(failed.service, failed.attempt + 1)]
        moved_with = dependents(self.services, name)
        for dependent in self.services:
            process = self._processes.get(dependent.name)
            if dependent.name in moved_with and process is not None:  # spawned with the old port
                logger.info("%s: respawned, since %s moved", dependent.name, name)
                process.stop(grace=self._stop_grace)
                respawned.append(self._spawn(dependent, process.attempt + 1))
        return respawned

    def _start_all(self) -> None:
        pending = list(self.services)
        waiting: list[ServiceProcess] = []
        while pending or len(self._healthy) < len(self.services):
            self._abort_if_stopped()
            self._wake.clear()
            for service in list(pending):  # in order: what a service waits for comes first
                if self._is_launchable(service):
                    pending.remove(service)
                    self._launch(service)
            self._abort_if_stopped()
            for service in self.services:
                preparation = self._preparations.get(service.name)
                if preparation is None or not preparation.done:
                    continue
                if service.name in self._processes:
                    continue
                if preparation.error is not None:
                    raise preparation.error
                waiting.append(self._spawn(service, 1))
            self._check_started(waiting)
            progressed = False
            for process in list(waiting):
                if process not in waiting:  # replaced by a respawn in this pass
                    continue
                # One that waits for others may answer only once they do.
                probe = set(process.service.waits_for) <= self._healthy
                try:
                    ready = process.check(probe=probe)
                except PortInUseError as exc:
                    fresh = self._relaunch(process, exc)
                    replaced = {p.service.name for p in fresh}
                    waiting = [p for p in waiting if p.service.name not in replaced] + fresh
                    continue
                if ready:
                    waiting.remove(process)
                    self._healthy_now(process)
                    progressed = True
            if not progressed and (waiting or self._preparations):
                self._wake.wait(self._poll)

    def _check_started(self, waiting: list[ServiceProcess]) -> None:
        """Fail at once, naming it, if a service that was healthy has died meanwhile."""
        starting = [s.name for s in self.services if s.name not in self._healthy]
        verb = "was" if len(starting) == 1 else "were"
        for service in self.services:
            process = self._processes.get(service.name)
            if process is not None and process not in waiting:
                process.check_running(during=f"while {', '.join(starting)} {verb} starting")

    def _healthy_now(self, process: ServiceProcess) -> None:
        name = process.service.name
        self._healthy.add(name)
        preparation = self._preparations[name]
        self._timings[name] = ServiceTiming(
            prepare=preparation.seconds or 0.0,
            healthy=process.healthy_seconds or 0.0,
            attempts=process.attempt,
            launched=preparation.began - self._began,
            ready=(process.healthy_at or 0.0) - self._began,
        )

    def stop(self) -> None:
        """Stop every service in reverse order, exactly once; raises StackError if one would not."""
        self._stop(quiet=False)

    def _stop(self, *, quiet: bool) -> None:
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        failures = self._release_all()
        if self._registry is not None and not failures:
            self._registry.close()  # kept on failure, so the janitor retries later
        if failures and not quiet:
            raise StackError("could not stop the stack cleanly: " + "; ".join(failures))

    def _release_all(self) -> list[str]:
        """Stop every process and clean up every prepared service, once each: in waves, each
        wave the services that nothing still running waits for, stopped side by side (the
        backend and the model server together, then Postgres)."""
        failures: list[str] = []
        with self._lock:
            for preparation in self._preparations.values():
                if not preparation.done:
                    preparation.service.cancel_prepare()  # a stop does not wait out an initdb
            for preparation in list(self._preparations.values()):
                preparation.join()  # cleanup must not race a copy still writing
            for wave in stop_waves(self.services):
                launched = [s for s in wave if s.name in self._preparations]
                # Never launched, or stop() was called from its own prepare: nothing to do.
                launched = [s for s in launched if self._preparations[s.name].done]
                if len(launched) > 1:
                    with ThreadPoolExecutor(len(launched), thread_name_prefix="haico-stop") as pool:
                        stopped = list(pool.map(self._stop_process, launched))
                else:
                    stopped = [self._stop_process(s) for s in launched]
                for service, failure in zip(launched, stopped, strict=True):
                    failure = failure or self._clean_up(service)  # one at a time: the registry
                    if failure is not None:
                        failures.append(failure)
            self._ports.release_all()
        return failures

    def _stop_process(self, service: Service) -> str | None:
        """Stop the service's process (idempotent); what went wrong, logged, or None."""
        process = self._processes.get(service.name)
        if process is None:
            return None
        try:
            process.stop(grace=self._stop_grace)
        except Exception as exc:  # keep stopping the rest; never mask the original error
            logger.error("%s: stop failed: %s", service.name, exc)
            return f"{service.name}: {exc}"
        return None

    def _clean_up(self, service: Service) -> str | None:
        if service.name in self._cleaned:
            return None
        self._cleaned.add(service.name)
        try:
            service.cleanup()
            if self._registry is not None:
                self._registry.forget(service.name)
        except Exception as exc:
            logger.error("%s: clean-up failed: %s", service.name, exc)
            return f"{service.name}: {exc}"
        return None

    def __enter__(self) -> Orchestrator:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop(quiet=exc_type is not None)


def _create_log(path: Path, mode: int) -> None:
    """Create `path` with exactly `mode` (whatever the umask); an existing log is kept."""
    make_dirs(path.parent, mode)
    with contextlib.suppress(FileExistsError):
        os.close(create_file(path, mode))
