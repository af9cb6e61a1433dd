"""Concurrency `auto`: the number of conversations an arm keeps in flight, adapted at each
sample of the model server's /metrics (`model_metrics.INTERVAL_S`, 1 s) within [1, max].

The policy is AIMD-like, as TCP's congestion window:

* **overloaded**: requests wait in the model server (`vllm:num_requests_waiting` > 0): its
  batch is full, so the target drops by 1; or its KV cache is KV_FULL (90%) used or more,
  where vLLM starts preempting (recomputing) requests: the target is halved. Either counts
  from what is in flight if that is less, never below 1, so nothing more is admitted; and
  there is no further drop until the conversations in flight have come down to the target
  (those already in flight finish: one drop per overload, not one per sample).
* **room**: nothing waits and the KV cache is below KV_FULL, items are queued and every slot
  is taken (the target is what holds them back). The target doubles until the first
  overload (slow start), then grows by 1 per sample, up to max. A model running as many
  requests as we have in flight may still have room: vLLM batches them until requests
  wait, and a conversation spends most of its time generating.
* otherwise, or when a sample lacks the model's figures (a server without /metrics): hold.

Each change is an `Adaptation`, recorded next to the results (run-config, the timeline, the
summary line). The item's identity never depends on it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from pytest_haico.ledger.model_metrics import Sample

KV_FULL = 0.9  # vLLM preempts (recomputes) requests as its KV cache fills: back off before


@dataclass(frozen=True)
class Adaptation:
    """One change of the in-flight target, and the sample that caused it."""

    at: float  # wall clock, seconds since the epoch
    old: int
    new: int
    reason: str


class AdaptiveConcurrency:
    """The target of concurrency `auto`; `observe` runs on the sampler's thread."""

    def __init__(
        self, *, initial: int, maximum: int, clock: Callable[[], float] = time.time
    ) -> None:
        if not 1 <= initial <= maximum:
            raise ValueError(f"need 1 <= initial <= maximum, got {initial} and {maximum}")
        self.initial = self.target = initial
        self.maximum = maximum
        self._clock = clock
        self._slow_start = True
        self._holding = False  # halved; not again until in flight came down to the target
        self._lock = threading.Lock()
        self._adaptations: list[Adaptation] = []

    @property
    def adaptations(self) -> list[Adaptation]:
        with self._lock:
            return list(self._adaptations)

    def observe(self, sample: Sample) -> Adaptation | None:
        """The new target after `sample`, as an `Adaptation`, or None when it holds."""
        target = self.target
        if sample.in_flight <= target:
            self._holding = False
        overload = _overload(sample)
        if overload is not None:
            self._slow_start = False
            if self._holding or target == 1:
                return None
            self._holding = True
            reason, severe = overload
            base = min(target, sample.in_flight)
            return self._change(max(1, base // 2 if severe else base - 1), reason)
        if not self._holding and target < self.maximum and _room(sample, target):
            grown = target * 2 if self._slow_start else target + 1
            reason = f"model has room ({sample.running:g} running, none waiting), items queued"
            return self._change(min(grown, self.maximum), reason)
        return None

    def ramp_end(self) -> float | None:
        """When the ramp up from `initial` ended: the last of the doublings that opened the
        run (slow start, before any other change), or None without one. Idle time before it
        is the ramp's, not a bottleneck's (`model_metrics.summarise`)."""
        end = None
        for a in self.adaptations:
            if a.new != min(a.old * 2, self.maximum):
                break
            end = a.at
        return end

    def record(self) -> dict[str, Any]:
        """What run-config and the timeline keep of it."""
        adaptations = self.adaptations
        return {
            "mode": "auto",
            "bounds": [1, self.maximum],
            "initial": self.initial,
            "final": self.target,
            "adaptations": [asdict(a) for a in adaptations],
        }

    def _change(self, new: int, reason: str) -> Adaptation:
        adaptation = Adaptation(at=round(self._clock(), 3), old=self.target, new=new, reason=reason)
        with self._lock:
            self.target = new
            self._adaptations.append(adaptation)
        return adaptation


def _overload(sample: Sample) -> tuple[str, bool] | None:
    """Why the model is overloaded in `sample`, and whether severely (halve), or None."""
    if sample.kv_cache_usage is not None and sample.kv_cache_usage >= KV_FULL:
        return f"KV cache {sample.kv_cache_usage:.0%} used", True
    if sample.waiting is not None and sample.waiting > 0:
        return f"{sample.waiting:g} requests waiting", False
    return None


def _room(sample: Sample, target: int) -> bool:
    """The model has room (nothing waits; the caller checked the KV cache), and the target is
    what keeps queued items out."""
    if sample.running is None or sample.waiting is None:
        return False
    return sample.queued > 0 and sample.in_flight >= target


def summary_line(record: dict[str, Any]) -> str:
    """`concurrency auto: 1→6 (bounds 1 to 16), 5 adaptations`."""
    count = len(record["adaptations"])
    return (
        f"concurrency auto: {record['initial']}→{record['final']} (bounds 1 to "
        f"{record['bounds'][1]}), {count} adaptation{'' if count == 1 else 's'}"
    )
