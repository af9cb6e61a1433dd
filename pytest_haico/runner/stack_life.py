"""An arm's stack as its run sees it, and the stack's life: opened (built, or attached to a
kept one) and started once, interruptible while it starts, stopped exactly once."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from pytest_haico.errors import StackError
from pytest_haico.stack.service_log import read_log_tail

if TYPE_CHECKING:
    from pytest_haico.runner.watch import WatchedProcess
    from pytest_haico.stack.kept import KeptState
    from pytest_haico.stack.orchestrator import ServiceTiming
    from pytest_haico.stack.request import StackRequest


class RunStack(Protocol):
    """What a run uses of its stack: a `Stack` it started, or an `AttachedStack` (kept)."""

    @property
    def backend_url(self) -> str: ...
    @property
    def llm_url(self) -> str: ...
    @property
    def model_endpoint(self) -> str: ...
    @property
    def api_key(self) -> str: ...
    @property
    def admin_token(self) -> str: ...
    @property
    def readonly_dsn(self) -> str: ...
    @property
    def postgres_version(self) -> str: ...
    @property
    def backend_config(self) -> Mapping[str, str]: ...
    @property
    def secrets(self) -> tuple[str, ...]: ...
    @property
    def llm(self) -> object | None: ...  # the run's own model server; None: another's
    @property
    def processes(self) -> Mapping[str, WatchedProcess]: ...
    @property
    def ports(self) -> Mapping[str, int]: ...
    @property
    def log_paths(self) -> Mapping[str, Path]: ...
    @property
    def timings(self) -> Mapping[str, ServiceTiming]: ...

    def start(self) -> object: ...
    def stop(self) -> None: ...
    def interrupt(self, reason: str) -> None: ...


class StackLife:
    """The arm's stack from its opening to its stop, and how long that took."""

    def __init__(
        self,
        source: StackRequest | KeptState,
        *,
        open_stack: Callable[[StackRequest | KeptState], RunStack],
    ) -> None:
        self._source = source
        self._open_stack = open_stack
        self.stack: RunStack | None = None
        self._interrupted: str | None = None
        self._stopped = False
        self._opened_at: float | None = None
        self._stopped_at: float | None = None

    @property
    def elapsed_s(self) -> float | None:
        """Seconds from the opening of the stack to its stop (or to now)."""
        if self._opened_at is None:
            return None
        return (self._stopped_at or time.monotonic()) - self._opened_at

    def open(self) -> RunStack:
        """Build the stack (or attach to the kept one); nothing starts yet."""
        self._opened_at = time.monotonic()
        self.check_interrupted()
        stack = self._open_stack(self._source)
        self.stack = stack
        return stack

    def start(self) -> None:
        """Start the opened stack (leak-proof: a failure stops what started, then raises)."""
        stack = self._require_stack()
        if self._interrupted is not None:  # before the stack could see it
            stack.interrupt(self._interrupted)
        stack.start()

    def interrupt(self, reason: str) -> None:
        """End a start in progress at its next step; safe from a signal handler."""
        self._interrupted = reason
        if self.stack is not None:
            self.stack.interrupt(reason)

    def check_interrupted(self) -> None:
        """Raise StackError if the start was interrupted."""
        if self._interrupted is not None:
            raise StackError(f"{self._interrupted}: the start was interrupted")

    def stop(self) -> None:
        """Stop the stack, once."""
        if self._stopped:
            return
        self._stopped = True
        try:
            if self.stack is not None:
                self.stack.stop()
        finally:
            self._stopped_at = time.monotonic()

    def log_tail(self, service: str) -> str:
        """The last lines of a service's log, redacted ("" for a service it has not)."""
        stack = self.stack
        if stack is None or service not in stack.log_paths:
            return ""
        return read_log_tail(stack.log_paths[service], secrets=stack.secrets)

    def _require_stack(self) -> RunStack:
        if self.stack is None:
            raise StackError("the stack was not opened")
        return self.stack
