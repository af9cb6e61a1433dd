"""An attempt's times, from one owner: when it started, how long it took, when it finished.

A record's `started_at`, `finished_at` and `duration_s` all come from one `AttemptTimes`,
read off one `Stopwatch`: the start is a wall-clock reading, the duration the monotonic
clock's, and the finish their sum. So a duration is never negative and a finish never
precedes its start, whichever thread reads the stopwatch, and whatever the wall clock did
meanwhile.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta


@dataclass(frozen=True, slots=True)
class AttemptTimes:
    """A measured span: its wall-clock start and its monotonic duration (never negative)."""

    started_at: datetime
    duration_s: float

    def __post_init__(self) -> None:
        if not self.duration_s >= 0:  # also refuses NaN
            raise ValueError(f"a duration is never negative, got {self.duration_s}")

    @property
    def finished_at(self) -> datetime:
        return self.started_at + timedelta(seconds=self.duration_s)

    @classmethod
    def instant(cls) -> AttemptTimes:
        """A zero-length span now: for an attempt that ended before it began."""
        return cls(datetime.now(UTC), 0.0)


class Stopwatch:
    """Started once (a later `start` is ignored), read from any thread, any number of times."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._started_at: datetime | None = None
        self._started = 0.0

    def start(self) -> None:
        with self._lock:
            if self._started_at is None:
                self._started_at = datetime.now(UTC)
                self._started = time.monotonic()

    @property
    def started_at(self) -> datetime | None:
        return self._started_at

    def read(self) -> AttemptTimes:
        """The span from the start to now; a zero-length span now if it never started."""
        with self._lock:
            if self._started_at is None:
                return AttemptTimes.instant()
            return AttemptTimes(self._started_at, max(time.monotonic() - self._started, 0.0))
