"""Two sides' records paired by item (script × repeat, or script under a pass rule), and
the paired figures per stratum and overall (`pytest_haico.results.stats` computes them).

An item is paired when both sides hold a newest record of it whose conversation ran to
its own end (`MEASURED_VERDICTS`); an infrastructure failure (infra_error, rate_limited,
interrupted, gave_up) or a substituted model on either side leaves it out, counted by
side and verdict; an item only one side has is unpaired, counted by side.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pytest_haico.config.pass_rule import PassRule
from pytest_haico.ledger.verdicts import MEASURED_VERDICTS, Verdict
from pytest_haico.results.records import Record, require
from pytest_haico.results.stats import (
    CONFIDENCE,
    Difference,
    Median,
    PairedTable,
    Rate,
    mcnemar,
    median_difference,
    paired_difference,
    pass_at_k,
    pass_hat_k,
    wilson,
)

if TYPE_CHECKING:
    import pandas

OVERALL = "overall"
Key = tuple[str, str, int]


def passed(record: Record) -> bool:
    return record.verdict == Verdict.COMPLETED


def measured(record: Record) -> bool:
    return record.verdict in MEASURED_VERDICTS


@dataclass(frozen=True)
class StratumComparison:
    """One stratum's (or `OVERALL`) paired figures, B against A."""

    stratum: str
    a: Rate
    b: Rate
    table: PairedTable
    difference: Difference
    p: float
    latency: Median
    tokens: Median
    turns: Median
    left_out: dict[str, int] = field(default_factory=dict)  # "A infra_error": count
    only_a: int = 0
    only_b: int = 0
    scripts: int = 0  # distinct scripts among the pairs (repeats = pairs / scripts)


@dataclass(frozen=True)
class Comparison:
    """Every stratum's paired figures, then `OVERALL`'s; `unit` names what was paired."""

    strata: list[StratumComparison]
    unit: str
    confidence: float

    @property
    def overall(self) -> StratumComparison:
        return self.strata[-1]


def _key(record: Record, by_arm: bool) -> Key:
    return (record.arm if by_arm else "", record.script, record.repeat)


def _figure(record: Record, name: str) -> float | None:
    if name == "latency":
        return record.duration_s
    if name == "turns":
        return float(len(record.turns))
    total = 0.0
    for turn in record.turns:
        for part in ("tokens_in", "tokens_out"):
            value = turn.get(part)
            if isinstance(value, int | float) and not isinstance(value, bool):
                total += value
    return total


def compare_records(
    a: Iterable[Record],
    b: Iterable[Record],
    *,
    pass_rule: PassRule | None = None,
    confidence: float = CONFIDENCE,
) -> Comparison:
    """Pair each side's newest records (`Results.newest()`) and compute the figures.

    Items are matched by arm, script and repeat when both sides hold the same arms, else
    (one arm each) by script and repeat. With a `pass_rule` the pass rates compare
    scripts, each script's repeats made one verdict (a script is left out when any of its
    repeats is); latency, tokens and turns always compare script × repeat.
    """
    a, b = list(a), list(b)
    by_arm = {r.arm for r in a} == {r.arm for r in b}
    left = {_key(r, by_arm): r for r in a}
    right = {_key(r, by_arm): r for r in b}
    strata = sorted({r.stratum for r in left.values()} | {r.stratum for r in right.values()})
    results = [_stratum(name, left, right, pass_rule, confidence, name) for name in strata]
    results.append(_stratum(OVERALL, left, right, pass_rule, confidence, None))
    unit = "script × repeat" if pass_rule is None else f"script (pass_rule {pass_rule})"
    return Comparison(results, unit, confidence)


def _stratum(
    name: str,
    left: dict[Key, Record],
    right: dict[Key, Record],
    rule: PassRule | None,
    confidence: float,
    stratum: str | None,
) -> StratumComparison:
    def chosen(record: Record) -> bool:
        return stratum is None or record.stratum == stratum

    keys_a = {k for k, r in left.items() if chosen(r)}
    keys_b = {k for k, r in right.items() if chosen(r)}
    both = sorted(keys_a & keys_b)
    left_out: Counter[str] = Counter()
    paired: list[Key] = []
    for key in both:
        sides = (("A", left[key]), ("B", right[key]))
        skipped = [f"{side} {r.verdict}" for side, r in sides if not measured(r)]
        left_out.update(skipped)
        if not skipped:
            paired.append(key)
    verdicts = _verdicts(paired, both, left, right, rule)
    table = PairedTable(
        both=sum(1 for x, y in verdicts if x and y),
        lost=sum(1 for x, y in verdicts if x and not y),
        gained=sum(1 for x, y in verdicts if y and not x),
        neither=sum(1 for x, y in verdicts if not (x or y)),
    )
    medians = {
        figure: median_difference(
            [
                fb - fa
                for key in paired
                if (fa := _figure(left[key], figure)) is not None
                and (fb := _figure(right[key], figure)) is not None
            ],
            confidence,
        )
        for figure in ("latency", "tokens", "turns")
    }
    n = table.n
    return StratumComparison(
        name,
        wilson(table.both + table.lost, n, confidence),
        wilson(table.both + table.gained, n, confidence),
        table,
        paired_difference(table, confidence),
        mcnemar(table),
        medians["latency"],
        medians["tokens"],
        medians["turns"],
        dict(sorted(left_out.items())),
        len(keys_a - keys_b),
        len(keys_b - keys_a),
        len({key[:2] for key in paired}),
    )


def _verdicts(
    paired: list[Key],
    both: list[Key],
    left: dict[Key, Record],
    right: dict[Key, Record],
    rule: PassRule | None,
) -> list[tuple[bool, bool]]:
    if rule is None:
        return [(passed(left[k]), passed(right[k])) for k in paired]
    complete = set(paired)
    scripts: dict[tuple[str, str], list[Key]] = {}
    for key in both:
        scripts.setdefault(key[:2], []).append(key)
    verdicts = []
    for keys in scripts.values():
        if not all(k in complete for k in keys):
            continue  # a repeat was left out: the script's verdict is unknown
        a = rule.passes([passed(left[k]) for k in keys])
        b = rule.passes([passed(right[k]) for k in keys])
        if a is not None and b is not None:
            verdicts.append((a, b))
    return verdicts


@dataclass(frozen=True)
class RepeatFigures:
    """One arm × stratum's repeats: pass@k and pass^k at k (averaged over its scripts with
    at least k measured repeats), and the share of scripts whose repeats all agree."""

    arm: str
    stratum: str
    k: int
    scripts: int
    pass_at_k: float
    pass_hat_k: float
    consistent: int


def repeat_figures(records: Iterable[Record]) -> list[RepeatFigures]:
    """Per arm × stratum with repeats (a script measured at least twice); k is the fewest
    measured repeats of those scripts."""
    groups: dict[tuple[str, str], dict[str, list[bool]]] = {}
    for record in records:
        if measured(record):
            scripts = groups.setdefault((record.arm, record.stratum), {})
            scripts.setdefault(record.script, []).append(passed(record))
    figures = []
    for (arm, stratum), scripts in sorted(groups.items()):
        repeated = [v for v in scripts.values() if len(v) >= 2]
        if not repeated:
            continue
        k = min(len(v) for v in repeated)
        figures.append(
            RepeatFigures(
                arm,
                stratum,
                k,
                len(repeated),
                sum(pass_at_k(len(v), sum(v), k) for v in repeated) / len(repeated),
                sum(pass_hat_k(len(v), sum(v), k) for v in repeated) / len(repeated),
                sum(1 for v in repeated if len(set(v)) == 1),
            )
        )
    return figures


def comparison_frame(comparison: Comparison) -> pandas.DataFrame:
    """One row per stratum, then `OVERALL`: the figures `haico compare` prints."""
    pd = require("pandas", "analysis", "Results.compare()")
    rows = []
    for s in comparison.strata:
        row: dict[str, object] = {
            "stratum": s.stratum,
            "pairs": s.table.n,
            "a_passed": s.a.passed,
            "a_rate": s.a.value,
            "a_low": s.a.low,
            "a_high": s.a.high,
            "b_passed": s.b.passed,
            "b_rate": s.b.value,
            "b_low": s.b.low,
            "b_high": s.b.high,
            "difference": s.difference.value,
            "difference_low": s.difference.low,
            "difference_high": s.difference.high,
            "pass_to_fail": s.table.lost,
            "fail_to_pass": s.table.gained,
            "mcnemar_p": s.p,
        }
        for name, median in (("latency", s.latency), ("tokens", s.tokens), ("turns", s.turns)):
            row.update(
                {
                    f"{name}_median": median.value,
                    f"{name}_low": median.low,
                    f"{name}_high": median.high,
                }
            )
        row.update(
            {
                "left_out": sum(s.left_out.values()),
                "only_a": s.only_a,
                "only_b": s.only_b,
                "unit": comparison.unit,
                "confidence": comparison.confidence,
                "resamples": s.latency.resamples,
            }
        )
        rows.append(row)
    frame: pandas.DataFrame = pd.DataFrame(rows)
    return frame
