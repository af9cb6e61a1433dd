"""Percentiles: nearest rank, one definition for the walltime gate, `haico cost` and the
report."""

from __future__ import annotations

import pytest

from pytest_haico.ledger.item_times import ItemTimes
from pytest_haico.percentiles import P95, nearest_rank, percentile
from pytest_haico.report.item_costs import StratumCost


def test_the_p95_is_the_smallest_value_that_covers_95_percent() -> None:
    values = [float(v) for v in range(1, 21)]  # 19 of 20 are 95%
    assert percentile(reversed(values), P95) == 19.0
    assert nearest_rank(values, 0.5) == 10.0
    assert percentile([7.0], P95) == 7.0
    assert percentile([], P95) is None
    with pytest.raises(ValueError):
        nearest_rank([], P95)


def test_the_walltime_gate_and_haico_cost_give_the_same_p95() -> None:
    durations = [float(v) for v in range(1, 41)]
    times = ItemTimes()
    for duration in durations:
        assert times.observe("default", "completed", duration)
    gate = times.get("default")
    started = [f"2026-01-01T00:00:{i:02d}+00:00".encode() for i in range(len(durations))]
    pairs = list(zip(started, durations, strict=True))
    cost = StratumCost.from_times("demo", "default", pairs, done=40)
    assert gate is not None and gate.p95_s == cost.p95_s == percentile(durations, P95) == 38.0
