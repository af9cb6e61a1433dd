"""One service's `prepare` in a worker thread, so that a slow one (a copy) overlaps the
others' start-up."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from pytest_haico.stack.service import Service


class Preparation:
    """One service's `prepare`, in a worker thread: a slow one (a copy) overlaps the others."""

    def __init__(self, service: Service, log_path: Path, wake: threading.Event) -> None:
        self.service = service
        self.began = time.monotonic()
        self.seconds: float | None = None  # set once prepare returned or raised
        self.error: BaseException | None = None
        self._log_path = log_path
        self._wake = wake
        # A daemon: stop() joins it, and nothing else may hold the interpreter open.
        self._thread = threading.Thread(
            target=self._run, name=f"haico-prepare-{service.name}", daemon=True
        )
        self._thread.start()

    def _run(self) -> None:
        try:
            self.service.prepare(self._log_path)
        except BaseException as exc:  # re-raised by the orchestrator's thread
            self.error = exc
        finally:
            self.seconds = time.monotonic() - self.began
            self._wake.set()

    @property
    def done(self) -> bool:
        """Whether prepare returned or raised."""
        return self.seconds is not None

    def join(self) -> None:
        """Wait for prepare to end (not when called from prepare itself)."""
        if self._thread is not threading.current_thread():
            self._thread.join()
