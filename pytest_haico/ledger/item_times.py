"""How long a stratum's items take, measured from the ledgers: for walltime admission
(p95) and the walltime gate (the longest)."""

from __future__ import annotations

import bisect
import math
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from pytest_haico.errors import HaicoError
from pytest_haico.ledger.format import RawRecord, Warn, iter_ledger_dir
from pytest_haico.ledger.verdicts import MEASURED_VERDICTS
from pytest_haico.percentiles import P95, nearest_rank


@dataclass(frozen=True, slots=True)
class ItemTime:
    """How long items of one stratum take: p95 (nearest rank), the longest, the sample count."""

    p95_s: float
    longest_s: float
    samples: int


class ItemTimes:
    """Measured item times per stratum: attempts whose verdict is in `MEASURED_VERDICTS`.

    Thread-safe: the runner's finish threads `observe` while its loop calls `get`.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sorted: dict[str, list[float]] = {}

    @classmethod
    def from_ledger_dir(cls, directory: Path, *, warn: Warn) -> ItemTimes:
        """Item times from every ledger of an arm's ledger directory.

        Lines the reader skips are not reported again (resume reads the same files and
        reports them); a directory or file that cannot be read is reported through
        ``warn``, and what was read before it is kept.
        """
        times = cls()
        try:
            times.add_records(iter_ledger_dir(directory, warn=lambda _: None))
        except (HaicoError, OSError) as exc:
            warn(
                f"walltime admission cannot use the item times of earlier runs: {exc}; "
                "strata without a measured item time are admitted without a walltime check"
            )
        return times

    def add_records(self, records: Iterable[RawRecord]) -> None:
        """Count ledger records; one without a usable stratum, verdict or duration is
        passed over."""
        for record in records:
            data = record.data
            self.observe(data.get("stratum"), data.get("verdict"), data.get("duration_s"))

    def observe(self, stratum: object, verdict: object, duration_s: object) -> bool:
        """Count one attempt; False (and nothing counted) unless it measures an item time."""
        # Read from JSON: the verdict may be any value (even an unhashable one).
        if not isinstance(stratum, str) or not isinstance(verdict, str):
            return False
        if verdict not in MEASURED_VERDICTS or isinstance(duration_s, bool):
            return False
        if not isinstance(duration_s, int | float) or not 0 <= duration_s < math.inf:
            return False
        with self._lock:
            bisect.insort(self._sorted.setdefault(stratum, []), float(duration_s))
        return True

    def get(self, stratum: str) -> ItemTime | None:
        """The stratum's item time, or None when none of its items was measured."""
        with self._lock:
            durations = self._sorted.get(stratum)
            if not durations:
                return None
            p95 = nearest_rank(durations, P95)
            return ItemTime(p95_s=p95, longest_s=durations[-1], samples=len(durations))
