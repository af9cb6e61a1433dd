"""The statistics behind `haico compare`, `haico validate`, the reports and
`Results.compare`: one owner for every interval, test and sample size.

* `wilson`: a pass rate with its Wilson score interval (scipy's `binomtest`);
* `paired_difference`: the difference of two paired pass rates (B − A) with Newcombe's
  interval for paired data (1998, method 10: the two Wilson intervals combined with the
  continuity-corrected correlation of the pairs);
* `mcnemar`: McNemar's exact test, a two-sided binomial test of the discordant pairs;
* `median_difference`: the median paired difference of a figure (latency, tokens, turns)
  with a percentile bootstrap interval (scipy's `bootstrap`, fixed seed);
* `pass_at_k`, `pass_hat_k`: the chance that at least one of k repeats passes, and that all
  k pass (the unbiased estimators over n ≥ k repeats);
* `pairs_needed`: the pairs needed to show a drop at a confidence and power, from the
  measured discordance (Connor 1987's normal approximation for McNemar's test);
* `decide`: the gate, "B's pass rate is lower than A's by more than `max_drop`": true only
  when the whole interval of B − A lies below −`max_drop`.

scipy is in the `analysis` extra; without it these raise `MissingExtraError` naming it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pytest_haico.results.records import require

CONFIDENCE = 0.95
POWER = 0.8
# Bootstrap resamples and seed: fixed, so the same records always give the same interval.
RESAMPLES = 2000
SEED = 20260407
_BATCH_VALUES = 10_000_000


def _scipy_stats() -> Any:
    what = "computing the paired statistics (haico compare, validate, report)"
    require("scipy", "analysis", what)
    import scipy.stats

    return scipy.stats


@dataclass(frozen=True)
class Rate:
    """`passed` of `n` with its interval at `confidence` (0 to 1 when n is 0)."""

    passed: int
    n: int
    low: float
    high: float
    confidence: float = CONFIDENCE

    @property
    def value(self) -> float | None:
        return self.passed / self.n if self.n else None

    def text(self) -> str:
        """`91.0% [86.2, 94.2] (182/200)`, or `- (0/0)`."""
        if not self.n:
            return "- (0/0)"
        return (
            f"{100 * self.passed / self.n:.1f}% [{100 * self.low:.1f}, {100 * self.high:.1f}] "
            f"({self.passed}/{self.n})"
        )


def wilson(passed: int, n: int, confidence: float = CONFIDENCE) -> Rate:
    """The pass rate `passed`/`n` with its Wilson score interval."""
    if not 0 <= passed <= n:
        raise ValueError(f"passed must be between 0 and n, got {passed} of {n}")
    if n == 0:
        return Rate(0, 0, 0.0, 1.0, confidence)
    ci = _scipy_stats().binomtest(passed, n).proportion_ci(confidence, method="wilson")
    return Rate(passed, n, float(ci.low), float(ci.high), confidence)


@dataclass(frozen=True)
class PairedTable:
    """Paired verdicts: both passed, A passed and B failed (`lost`), A failed and B passed
    (`gained`), both failed."""

    both: int = 0
    lost: int = 0
    gained: int = 0
    neither: int = 0

    @property
    def n(self) -> int:
        return self.both + self.lost + self.gained + self.neither

    @property
    def discordant(self) -> int:
        return self.lost + self.gained


@dataclass(frozen=True)
class Difference:
    """B − A of two paired pass rates, with its interval at `confidence`."""

    value: float
    low: float
    high: float
    confidence: float = CONFIDENCE

    def text(self) -> str:
        """`−5.0 points [−8.9, −2.7]`."""
        return f"{_points(self.value)} points [{_points(self.low)}, {_points(self.high)}]"


def _points(value: float) -> str:
    shown = f"{100 * value:+.1f}"
    return "0.0" if shown in ("+0.0", "-0.0") else shown.replace("-", "−")


def paired_difference(table: PairedTable, confidence: float = CONFIDENCE) -> Difference:
    """B's pass rate minus A's, with Newcombe's (1998) method-10 interval for paired data."""
    n = table.n
    if n == 0:
        return Difference(0.0, -1.0, 1.0, confidence)
    a_passed, b_passed = table.both + table.lost, table.both + table.gained
    a, b = wilson(a_passed, n, confidence), wilson(b_passed, n, confidence)
    pa, pb = a_passed / n, b_passed / n
    margins = a_passed * (n - a_passed) * b_passed * (n - b_passed)
    phi = 0.0
    if margins:
        cross = table.both * table.neither - table.lost * table.gained
        corrected = cross - n / 2 if cross > n / 2 else (cross if cross < 0 else 0.0)
        phi = corrected / math.sqrt(margins)
    # B − A: B's interval below its estimate and A's above make the lower bound.
    down_b, up_b = pb - b.low, b.high - pb
    down_a, up_a = pa - a.low, a.high - pa
    low = (pb - pa) - math.sqrt(max(0.0, down_b**2 - 2 * phi * down_b * up_a + up_a**2))
    high = (pb - pa) + math.sqrt(max(0.0, up_b**2 - 2 * phi * up_b * down_a + down_a**2))
    return Difference(pb - pa, max(-1.0, low), min(1.0, high), confidence)


def mcnemar(table: PairedTable) -> float:
    """McNemar's exact two-sided p: a binomial test of `lost` among the discordant pairs."""
    if table.discordant == 0:
        return 1.0
    return float(_scipy_stats().binomtest(table.lost, table.discordant, 0.5).pvalue)


@dataclass(frozen=True)
class Median:
    """The median of `n` paired differences (B − A) and its bootstrap interval."""

    n: int
    value: float | None
    low: float | None
    high: float | None
    resamples: int = RESAMPLES
    confidence: float = CONFIDENCE


def median_difference(
    differences: Sequence[float],
    confidence: float = CONFIDENCE,
    *,
    resamples: int = RESAMPLES,
    seed: int = SEED,
) -> Median:
    """The median paired difference with a percentile bootstrap interval (fixed seed: the
    same differences always give the same interval, whatever their order)."""
    values = sorted(float(d) for d in differences)
    if not values:
        return Median(0, None, None, None, resamples, confidence)
    median = float(values[len(values) // 2]) if len(values) % 2 else _mid(values)
    if len(values) < 2 or values[0] == values[-1]:
        return Median(len(values), median, median, median, resamples, confidence)
    import numpy

    result = _scipy_stats().bootstrap(
        (numpy.asarray(values),),
        numpy.median,
        n_resamples=resamples,
        confidence_level=confidence,
        method="percentile",
        rng=numpy.random.default_rng(seed),
        # Resamples at a time: about 10 million values (80 MB), whatever the item count.
        batch=max(1, _BATCH_VALUES // len(values)),
    )
    ci = result.confidence_interval
    return Median(len(values), median, float(ci.low), float(ci.high), resamples, confidence)


def _mid(values: list[float]) -> float:
    half = len(values) // 2
    return (values[half - 1] + values[half]) / 2


def pass_at_k(n: int, passed: int, k: int) -> float:
    """The chance that at least one of k repeats drawn from n passes (Chen et al. 2021)."""
    _check_k(n, passed, k)
    return 1.0 - math.comb(n - passed, k) / math.comb(n, k)


def pass_hat_k(n: int, passed: int, k: int) -> float:
    """The chance that all of k repeats drawn from n pass (pass^k, Yao et al. 2024)."""
    _check_k(n, passed, k)
    return math.comb(passed, k) / math.comb(n, k)


def _check_k(n: int, passed: int, k: int) -> None:
    if not (0 <= passed <= n and 1 <= k <= n):
        raise ValueError(f"need 0 ≤ passed ≤ n and 1 ≤ k ≤ n, got n={n} passed={passed} k={k}")


def pairs_needed(
    drop: float,
    discordance: float,
    *,
    max_drop: float = 0.0,
    confidence: float = CONFIDENCE,
    power: float = POWER,
) -> int | None:
    """Pairs needed for the interval of B − A to lie below −`max_drop` with chance `power`
    when B's pass rate is truly `drop` lower and a share `discordance` of the pairs differ
    (Connor 1987); None when no number of pairs can (the drop is not beyond the margin)."""
    effect = drop - max_drop
    if effect <= 0 or drop <= 0:
        return None
    discordance = min(1.0, max(discordance, drop))  # no fewer discordant pairs than the drop
    norm = _scipy_stats().norm
    z_a, z_b = float(norm.ppf(1 - (1 - confidence) / 2)), float(norm.ppf(power))
    root = z_a * math.sqrt(discordance) + z_b * math.sqrt(discordance - drop**2)
    return math.ceil((root / effect) ** 2)


@dataclass(frozen=True)
class Decision:
    """The gate's verdict and the line that says which figure decided."""

    failed: bool
    line: str


def decide(difference: Difference, *, max_drop: float, what: str = "pass rate") -> Decision:
    """Fail only when the whole interval of B − A lies below −`max_drop`."""
    level = f"{100 * difference.confidence:g}%"
    margin = f"{100 * max_drop:g} point(s)"
    upper = _points(difference.high)
    threshold = f"−{100 * max_drop:g}" if max_drop else "0"
    if difference.high < -max_drop:
        return Decision(
            True,
            f"FAIL: {what} dropped by more than {margin} at {level}: the upper bound of "
            f"B − A, {upper} points, is below {threshold}",
        )
    return Decision(
        False,
        f"pass: a drop of more than {margin} in the {what} is not shown at {level}: the upper "
        f"bound of B − A, {upper} points, is not below {threshold}",
    )
