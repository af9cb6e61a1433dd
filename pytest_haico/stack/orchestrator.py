"""Ordered, leak-proof start and exactly-once stop of a set of services."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from pytest_haico.errors import StackError
from pytest_haico.stack.janitor import Registry, ServiceRecord, reap_orphans
from pytest_haico.stack.ports import PortPool
from pytest_haico.stack.service import PortInUseError, Service, ServiceProcess

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServiceTiming:
    """Where a service's start-up time went, in seconds."""

    prepare: float  # e.g. the Postgres template copy
    healthy: float  # spawn of the successful attempt → healthy
    attempts: int  # 1 unless its port was taken under it


class Orchestrator:
    """Starts services in dependency order, in parallel where allowed; stops them in reverse.

    A service is spawned once every service it `requires` is healthy; services
    spawned together are polled together. Before anything starts, the janitor reaps
    orphans of dead sessions on this node.
    """

    def __init__(
        self,
        services: Sequence[Service],
        log_dir: Path,
        *,
        state_dir: Path | None = None,
        ports: PortPool | None = None,
        registry_mirror: Path | None = None,
        stop_grace: float = 10.0,
        max_port_attempts: int = 5,
        poll_interval: float = 0.05,
        reap: bool = True,
    ) -> None:
        names = [service.name for service in services]
        if len(set(names)) != len(names):
            raise StackError(f"duplicate service names in {names}")
        order: list[str] = []
        for service in services:
            missing = [r for r in service.requires if r not in order]
            if missing:
                raise StackError(
                    f"{service.name} requires {missing}, which must be listed before it"
                )
            order.append(service.name)
        self.services = tuple(services)
        self.log_dir = log_dir
        self._state_dir = state_dir
        self._ports = ports if ports is not None else PortPool(state_dir)
        self._registry_mirror = registry_mirror
        self._registry: Registry | None = None
        self._stop_grace = stop_grace
        self._max_port_attempts = max_port_attempts
        self._poll = poll_interval
        self._reap = reap
        self._prepared: dict[str, float] = {}  # name → prepare seconds
        self._processes: dict[str, ServiceProcess] = {}
        self._timings: dict[str, ServiceTiming] = {}
        self._lock = threading.RLock()  # a signal handler may stop() mid-start()
        self._started = False
        self._stopped = False

    @property
    def processes(self) -> Mapping[str, ServiceProcess]:
        """The current process of each spawned service (pid, port, log path)."""
        return dict(self._processes)

    @property
    def timings(self) -> Mapping[str, ServiceTiming]:
        """Per healthy service: prepare seconds, spawn → healthy seconds, attempts."""
        return dict(self._timings)

    def port(self, name: str) -> int:
        """The port `name` listens on."""
        return self._processes[name].port

    def log_path(self, name: str) -> Path:
        """Where `name` logs."""
        return self.log_dir / f"{name}.log"

    def start(self) -> None:
        """Start everything or nothing: on any failure, stop what started, then raise."""
        with self._lock:
            if self._started:
                raise StackError("this stack was already started")
            self._started = True
        try:
            if self._reap:
                reap_orphans(self._state_dir)
            self._registry = Registry(
                self._state_dir, mirror=self._registry_mirror, job=self._ports.job
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
                port=process.port if process else None,
                log=str(self.log_path(service.name)),
                cleanup=tuple(str(path) for path in service.cleanup_paths),
            )
        )

    def _abort_if_stopped(self, service: Service, process: ServiceProcess | None) -> None:
        # A signal handler may stop the stack while start() runs: nothing may outlive that.
        if not self._stopped:
            return
        if process is not None:
            process.stop(grace=self._stop_grace)
            self._ports.release(process.port)
        service.cleanup()
        raise StackError(f"the stack was stopped while starting {service.name}")

    def _launch(self, service: Service, attempt: int) -> ServiceProcess:
        self._abort_if_stopped(service, None)
        if service.name not in self._prepared:
            began = time.monotonic()
            try:
                service.prepare(self.log_path(service.name))
            finally:
                # Recorded even on failure, so stop() cleans up what prepare left.
                self._prepared[service.name] = time.monotonic() - began
                self._record(service, None)
        port = self._ports.claim(service.name)
        process = ServiceProcess(service, port, self.log_path(service.name), attempt=attempt)
        self._processes[service.name] = process
        process.spawn()
        self._abort_if_stopped(service, process)
        self._record(service, process)
        return process

    def _relaunch(self, failed: ServiceProcess, error: PortInUseError) -> ServiceProcess:
        failed.stop(grace=self._stop_grace)
        self._ports.release(failed.port)
        if failed.attempt >= self._max_port_attempts:
            raise StackError(f"gave up after {failed.attempt} taken ports: {error}") from error
        logger.warning(
            "%s: port %d was taken before it could bind; retrying on another port",
            failed.service.name,
            failed.port,
        )
        return self._launch(failed.service, failed.attempt + 1)

    def _start_all(self) -> None:
        pending = list(self.services)
        waiting: list[ServiceProcess] = []
        healthy: set[str] = set()
        while pending or waiting:
            for service in [s for s in pending if set(s.requires) <= healthy]:
                pending.remove(service)
                waiting.append(self._launch(service, 1))
            progressed = False
            for process in list(waiting):
                try:
                    ready = process.check()
                except PortInUseError as exc:
                    waiting[waiting.index(process)] = self._relaunch(process, exc)
                    continue
                if ready:
                    waiting.remove(process)
                    name = process.service.name
                    healthy.add(name)
                    self._timings[name] = ServiceTiming(
                        prepare=self._prepared[name],
                        healthy=process.healthy_seconds or 0.0,
                        attempts=process.attempt,
                    )
                    progressed = True
            if waiting and not progressed:
                time.sleep(self._poll)

    def stop(self) -> None:
        """Stop every service in reverse order, exactly once; raises StackError if one would not."""
        self._stop(quiet=False)

    def _stop(self, *, quiet: bool) -> None:
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        failures: list[str] = []
        for service in reversed(self.services):
            if service.name not in self._prepared:
                continue
            process = self._processes.get(service.name)
            try:
                if process is not None:
                    process.stop(grace=self._stop_grace)
                    self._ports.release(process.port)
                service.cleanup()
                if self._registry is not None:
                    self._registry.forget(service.name)
            except Exception as exc:  # keep stopping the rest; never mask the original error
                logger.error("%s: stop failed: %s", service.name, exc)
                failures.append(f"{service.name}: {exc}")
        self._ports.release_all()
        if self._registry is not None and not failures:
            self._registry.close()  # kept on failure, so the janitor retries later
        if failures and not quiet:
            raise StackError("could not stop the stack cleanly: " + "; ".join(failures))

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
