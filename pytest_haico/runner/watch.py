"""Watches an arm's service processes while its conversations are in flight: the first one
found dead stops the arm at once, instead of every turn waiting out its timeout."""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from pytest_haico.stack.attached import ENDED

_log = logging.getLogger(__name__)
# Seconds between two looks at the processes: a waitid per service, nothing more.
POLL_INTERVAL_S = 0.2


class WatchedProcess(Protocol):
    """A service process as the watch sees it: this run's child, or a kept stack's."""

    pid: int | None
    log_path: Path

    def exit_status(self) -> int | None: ...

    def log_tail(self) -> str: ...


@dataclass(frozen=True)
class ServiceDeath:
    """A service process that ended while the arm needed it."""

    service: str
    pid: int | None
    status: int
    log_path: Path
    log_tail: str

    def describe(self) -> str:
        """One message for the records, the summary and the exit: what died, how, its log."""
        return (
            f"{self.service} (pid {self.pid}) {_how(self.status)} while conversations were "
            f"in flight; last lines of {self.log_path}:\n{self.log_tail}"
        )


class ServiceWatch:
    """Looks at the services' PIDs every `POLL_INTERVAL_S` while ``busy()`` holds; calls
    ``on_death`` once, for the first death found, from its own thread or from `check`'s caller.
    """

    def __init__(
        self,
        processes: Callable[[], Mapping[str, WatchedProcess]],
        *,
        busy: Callable[[], bool],
        on_death: Callable[[ServiceDeath], None],
        name: str = "haico-watch",
    ) -> None:
        self._processes = processes
        self._busy = busy
        self._on_death = on_death
        self._name = name
        self._lock = threading.Lock()
        self._death: ServiceDeath | None = None
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def death(self) -> ServiceDeath | None:
        with self._lock:
            return self._death

    def start(self) -> None:
        # A daemon: a watcher must never hold the interpreter at exit.
        self._thread = threading.Thread(target=self._watch, name=self._name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop watching (before the stack stops: its own stop is no death); idempotent."""
        self._stopped.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

    def check(self) -> ServiceDeath | None:
        """Look now; the first death found is kept, reported once and returned ever after."""
        with self._lock:
            if self._death is not None or self._stopped.is_set():
                return self._death
            death = _first_death(self._processes())
            self._death = death
        if death is not None:
            self._on_death(death)
        return death

    def _watch(self) -> None:
        while not self._stopped.wait(POLL_INTERVAL_S):
            try:
                if self._busy() and self.check() is not None:
                    return
            except Exception:  # a broken watch must not end silently mid-run
                _log.exception("haico: watching the services of %s", self._name)
                return


def _first_death(processes: Mapping[str, WatchedProcess]) -> ServiceDeath | None:
    for name, process in processes.items():
        status = process.exit_status()
        if status is not None:
            return ServiceDeath(
                service=name,
                pid=process.pid,
                status=status,
                log_path=process.log_path,
                log_tail=process.log_tail(),
            )
    return None


def _how(status: int) -> str:
    if status == ENDED:
        return "ended (a kept stack's service: its supervisor logged how)"
    if status >= 0:
        return f"exited with status {status}"
    try:
        return f"was killed by {signal.Signals(-status).name}"
    except ValueError:
        return f"was killed by signal {-status}"
