"""The circuit breaker: too many recent infrastructure failures stop the run from admitting."""

from __future__ import annotations

import threading
from collections import Counter, deque


class CircuitBreaker:
    """Trips when ``threshold`` of the last ``window`` conversations failed on infrastructure.

    Once tripped it stays tripped and keeps the reason it tripped with: the node or
    the stack is bad, and a resubmitted job lands elsewhere. Thread-safe.
    """

    def __init__(self, window: int = 8, threshold: int = 5) -> None:
        if not 1 <= threshold <= window:
            raise ValueError(
                f"the breaker needs 1 <= threshold <= window, got {threshold} of {window}"
            )
        self.window = window
        self.threshold = threshold
        self._lock = threading.Lock()
        # One entry per conversation: the failing service, "" for an unnamed
        # infrastructure failure, None for a conversation that did not fail on it.
        self._outcomes: deque[str | None] = deque(maxlen=window)
        self._reason: str | None = None

    @property
    def tripped(self) -> bool:
        with self._lock:
            return self._reason is not None

    def observe(self, failed: bool, *, service: str | None = None) -> bool:
        """Count one ended conversation; True from the moment the breaker trips."""
        with self._lock:
            if self._reason is None:
                self._outcomes.append((service or "") if failed else None)
                if self._failures() >= self.threshold:
                    self._reason = self._describe()
            return self._reason is not None

    def reason(self) -> str:
        """Why it tripped (or, before that, how the window stands), naming the main culprit."""
        with self._lock:
            return self._reason or self._describe()

    def _failures(self) -> int:
        return sum(outcome is not None for outcome in self._outcomes)

    def _describe(self) -> str:
        text = (
            f"{self._failures()} of the last {len(self._outcomes)} conversations "
            "failed on infrastructure"
        )
        services = Counter(outcome for outcome in self._outcomes if outcome)
        if services:
            text += f" (mostly: {services.most_common(1)[0][0]})"
        return text
