"""The backend's per-minute query limit (``--rate-limit-rpm``): a sliding window of admissions."""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable

WINDOW_S = 60.0


class SlidingWindowLimiter:
    """Admits at most *limit* queries in any 60 s window; refused queries do not count."""

    def __init__(self, limit: int, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._limit = limit
        self._clock = clock
        self._admitted: deque[float] = deque()

    def admit(self) -> int | None:
        """Admit one query and return None, or return the seconds to wait (Retry-After)."""
        now = self._clock()
        while self._admitted and now - self._admitted[0] >= WINDOW_S:
            self._admitted.popleft()
        if len(self._admitted) >= self._limit:
            return max(1, math.ceil(WINDOW_S - (now - self._admitted[0])))
        self._admitted.append(now)
        return None
