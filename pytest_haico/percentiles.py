"""Percentiles, from one owner: nearest rank, the smallest value that covers the share.

Item times' p95 is the walltime admission's and gate's (`ledger.item_times`), `haico
cost`'s (`report.item_costs`) and the report's (`report.data`): one definition, so that the
figure the report prints is the one the job admitted items by.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

P95 = 0.95


def nearest_rank(ranked: Sequence[float], share: float) -> float:
    """The `share` percentile (0 < share <= 1) of `ranked`, sorted and not empty."""
    if not ranked:
        raise ValueError("a percentile of no values")
    return ranked[max(math.ceil(share * len(ranked)) - 1, 0)]


def percentile(values: Iterable[float], share: float) -> float | None:
    """The `share` percentile of `values` in any order; None for none."""
    ranked = sorted(values)
    return nearest_rank(ranked, share) if ranked else None
