"""How long one attempt at a service may take to become healthy, and what the wait says.

A service's `start_timeout` is a deadline from its spawn (None: none). Its optional
`stall_timeout_s` watches its log instead: the wait goes on while the log grows, and ends
once it has not grown for that long (a model server loading its weights writes a line every
few seconds, one that hangs writes nothing). Either way a process that dies ends the wait
at once (`ServiceProcess.check`).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Protocol

from pytest_haico.stack.service_log import read_last_log_line

logger = logging.getLogger(__name__)


class WatchedService(Protocol):
    """What the watch reads of a service (`service.Service` has it all)."""

    @property
    def name(self) -> str: ...
    @property
    def start_timeout(self) -> float | None: ...
    @property
    def secrets(self) -> tuple[str, ...]: ...


class StartWatch:
    """The limits on one attempt's start, checked at each health step, and its progress lines.

    Optional attributes of the service: `stall_timeout_s` (seconds its log may stay
    unchanged; None: no such limit), `stall_setting` (where that limit is set, for the
    message), `progress_every_s` (how often the wait logs the log's last line; None: never).
    """

    def __init__(
        self, service: WatchedService, log_path: Path, *, offset: int, spawned_at: float
    ) -> None:
        self.service = service
        self.log_path = log_path
        self._offset = offset
        self._spawned_at = spawned_at
        self._log_size = self._size()
        self._advanced_at = spawned_at  # when the log last grew
        self._progress_at = spawned_at  # when the wait last reported progress

    @property
    def stall_timeout(self) -> float | None:
        stall: float | None = getattr(self.service, "stall_timeout_s", None)
        return stall

    def overdue(self, now: float) -> str | None:
        """What ran out at `now` (for "<service> <what> (pid ...)"), or None."""
        deadline = self.service.start_timeout
        if deadline is not None and now - self._spawned_at > deadline:
            return f"was not healthy within {deadline:g} s"
        stall = self.stall_timeout
        if stall is None:
            return None
        size = self._size()
        if size != self._log_size:
            self._log_size, self._advanced_at = size, now
            return None
        if now - self._advanced_at <= stall:
            return None
        setting: str = getattr(self.service, "stall_setting", None) or "its stall timeout"
        return f"wrote nothing to its log for {stall:g} s ({setting}) before it was healthy"

    def report_progress(self, now: float) -> None:
        """Every `progress_every_s` of the wait, log what the service's log last said."""
        every: float | None = getattr(self.service, "progress_every_s", None)
        if not every or now - self._progress_at < every:
            return
        self._progress_at = now
        last = read_last_log_line(self.log_path, offset=self._offset, secrets=self.service.secrets)
        logger.info(
            "%s: not healthy yet after %.0f s (%s); its log last said: %s",
            self.service.name,
            now - self._spawned_at,
            self._limits(now),
            last if last is not None else "(nothing yet)",
        )

    def _limits(self, now: float) -> str:
        limits = []
        deadline = self.service.start_timeout
        if deadline is not None:
            limits.append(f"timeout {deadline:g} s")
        stall = self.stall_timeout
        if stall is not None:
            silent = now - self._advanced_at
            limits.append(f"log silent {silent:.0f} s of the stall timeout's {stall:g} s")
        return ", ".join(limits) or "no timeout"

    def _size(self) -> int:
        try:
            return os.stat(self.log_path).st_size
        except OSError:
            return -1
