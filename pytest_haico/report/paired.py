"""The paired statistics as `haico compare` and `haico validate` print them: per stratum and
overall, both pass rates with their intervals, the paired difference, McNemar's exact test,
the median paired differences; the interval gate (`--max-drop`); the plan (`--plan`: the
items needed to show a drop, and their cost); pass@k, pass^k and consistency of repeats."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

from pytest_haico.config.pass_rule import PassRule, parse_pass_rule
from pytest_haico.report.allocation import read_allocations, totals
from pytest_haico.report.data import build_report
from pytest_haico.results import MissingExtraError, Results, ResultsReadError, require
from pytest_haico.results.paired import (
    OVERALL,
    Comparison,
    StratumComparison,
    compare_records,
    repeat_figures,
)
from pytest_haico.results.stats import (
    CONFIDENCE,
    POWER,
    SEED,
    Decision,
    Median,
    decide,
    pairs_needed,
    wilson,
)

PASS_RULE_KEY = "ARM_RUN_PASS_RULE"


@dataclass(frozen=True)
class Gate:
    """`--max-drop` and `--confidence`: fail when B's pass rate is lower than A's by more
    than `max_drop` at `confidence`."""

    max_drop: float
    confidence: float = CONFIDENCE


@dataclass(frozen=True)
class Plan:
    """`--plan`: the items needed to show a `drop` (None: the measured one) at `power`."""

    drop: float | None = None
    power: float = POWER


@dataclass(frozen=True)
class Statistics:
    """What `statistics_lines` printed and decided."""

    lines: list[str]
    comparison: Comparison | None
    decision: Decision | None


def recorded_pass_rule(results: Results) -> str | None:
    """The `[run] pass_rule` the side's runs recorded in their run-config (None: none did);
    a `ResultsReadError` when its runs recorded different ones."""
    rules = {run.config.get(PASS_RULE_KEY) or None for run in build_report(results).runs} - {None}
    if len(rules) > 1:
        raise ResultsReadError(
            f"the runs in {results.path} recorded different pass rules "
            f"({', '.join(sorted(str(r) for r in rules))}): give --pass-rule"
        )
    return next(iter(rules), None)


def resolve_pass_rule(given: str | None, a: Results, b: Results) -> PassRule | None:
    """`--pass-rule`, else the rule both sides' runs recorded, else none (per repeat)."""
    if given is not None:
        try:
            return parse_pass_rule(given)
        except ValueError as exc:
            raise ResultsReadError(f"--pass-rule: {exc}") from None
    rules = {recorded_pass_rule(a), recorded_pass_rule(b)} - {None}
    if len(rules) > 1:
        raise ResultsReadError(
            f"A's runs recorded pass_rule {recorded_pass_rule(a)} and B's "
            f"{recorded_pass_rule(b)}: give --pass-rule to compare under one"
        )
    rule = next(iter(rules), None)
    try:
        return None if rule is None else parse_pass_rule(rule)
    except ValueError as exc:
        raise ResultsReadError(f"the runs' recorded {PASS_RULE_KEY}: {exc}") from None


def statistics_lines(
    a: Results,
    b: Results,
    *,
    gate: Gate | None = None,
    plan: Plan | None = None,
    pass_rule: str | None = None,
    confidence: float = CONFIDENCE,
) -> Statistics:
    """The paired section, the gate's line and the plan; without scipy, one line naming
    the extra (and a gate asked for is a `MissingExtraError`)."""
    if gate is not None:
        confidence = gate.confidence
    try:
        rule = resolve_pass_rule(pass_rule, a, b)
        comparison = compare_records(a.newest(), b.newest(), pass_rule=rule, confidence=confidence)
    except MissingExtraError as exc:
        if gate is not None or plan is not None:
            raise
        return Statistics([f"paired statistics: not computed: {exc}"], None, None)
    lines = list(comparison_lines(comparison))
    lines += repeat_lines(a, "A") + repeat_lines(b, "B")
    decision = None
    if gate is not None:
        decision = decide(comparison.overall.difference, max_drop=gate.max_drop)
        lines.append(f"gate (--max-drop {gate.max_drop:g} --confidence {confidence:g}): ")
        lines[-1] += decision.line
        if not decision.failed:
            lines += list(_needed_lines(comparison.overall, gate.max_drop, POWER, None))
    if plan is not None:
        lines += plan_lines(comparison, b, plan, max_drop=gate.max_drop if gate else 0.0)
    return Statistics(lines, comparison, decision)


def comparison_lines(comparison: Comparison) -> Iterator[str]:
    level = f"{100 * comparison.confidence:g}%"
    yield (
        f"paired statistics (B − A, {level} intervals, paired by {comparison.unit}; "
        "Wilson intervals on the rates, Newcombe's on the paired difference):"
    )
    shown = comparison.strata if len(comparison.strata) > 2 else comparison.strata[-1:]
    for stratum in shown:
        yield from _stratum_lines(stratum, comparison)


def _stratum_lines(s: StratumComparison, comparison: Comparison) -> Iterator[str]:
    name = "overall" if s.stratum == OVERALL else f"stratum {s.stratum}"
    yield f"  {name}: {s.table.n:,} pair(s)"
    yield f"    pass rate: A {s.a.text()}, B {s.b.text()}"
    yield f"    difference B − A: {s.difference.text()}"
    yield (
        f"    McNemar exact p = {_p(s.p)} (discordant: {s.table.lost} pass → fail, "
        f"{s.table.gained} fail → pass)"
    )
    resamples = s.latency.resamples
    yield (
        f"    median B − A: latency {_median(s.latency, ' s')}, tokens "
        f"{_median(s.tokens, '')}, turns {_median(s.turns, '')} (bootstrap, "
        f"{resamples} resamples, seed {SEED})"
    )
    left = sum(s.left_out.values())
    why = ", ".join(f"{count} {what}" for what, count in s.left_out.items())
    yield (
        f"    left out (infrastructure or substituted in either run): {left}"
        f"{f' ({why})' if why else ''}; unpaired: {s.only_a} only in A, {s.only_b} only in B"
        f"{' (no record on the other side)' if s.only_a or s.only_b else ''}"
    )


def _p(p: float) -> str:
    return f"{p:.3g}" if p >= 0.001 else f"{p:.1e}"


def _median(m: Median, unit: str) -> str:
    if m.value is None or m.low is None or m.high is None:
        return "-"
    return f"{_signed(m.value)}{unit} [{_signed(m.low)}, {_signed(m.high)}]"


def _signed(value: float) -> str:
    text = f"{value:+.3g}"
    return "0" if float(text) == 0 else text.replace("-", "−")


def repeat_lines(results: Results, label: str) -> list[str]:
    """pass@k, pass^k and consistency per arm × stratum of one side (none without repeats)."""
    lines = []
    for f in repeat_figures(results.newest()):
        lines.append(
            f"repeats ({label}) arm {f.arm} stratum {f.stratum}: pass@{f.k} "
            f"{f.pass_at_k:.1%}, pass^{f.k} {f.pass_hat_k:.1%} over {f.scripts} script(s); "
            f"consistent (every repeat the same verdict): {f.consistent}/{f.scripts}"
        )
    return lines


def _needed_lines(
    s: StratumComparison, max_drop: float, power: float, drop: float | None
) -> Iterator[str]:
    """How many pairs would show the drop (the measured one unless given)."""
    n = s.table.n
    measured = (s.table.lost - s.table.gained) / n if n else 0.0
    drop = measured if drop is None else drop
    discordance = s.table.discordant / n if n else 0.0
    if drop <= 0:
        yield f"  no drop measured (B − A {s.difference.text()}): nothing to show"
        return
    level = f"{100 * s.difference.confidence:g}%"
    used = min(1.0, max(discordance, drop))  # a drop needs at least as many discordant pairs
    differ = f"{used:.1%} of pairs differ"
    if used != discordance:
        differ += f" (measured {discordance:.1%}, raised to the drop)"
    for margin in sorted({0.0, max_drop}):
        needed = pairs_needed(
            drop, discordance, max_drop=margin, confidence=s.difference.confidence, power=power
        )
        beyond = f"more than {100 * margin:g} point(s)" if margin else "a drop"
        if needed is None:
            yield (
                f"  a {100 * drop:.1f}-point drop cannot show {beyond} with any number of "
                "items: it is within the margin"
            )
            continue
        repeats = (
            f", {math.ceil(needed / s.scripts)} repeat(s) of each of the {s.scripts:,} scripts"
            if s.scripts
            else ""
        )
        yield (
            f"  to show {beyond} at {level} with {power:.0%} power, if the drop is "
            f"{100 * drop:.1f} points and {differ}: {needed:,} pairs "
            f"(now {n:,}{repeats})"
        )


def plan_lines(comparison: Comparison, b: Results, plan: Plan, *, max_drop: float) -> list[str]:
    """Items needed per stratum and overall, and their cost from B's measured allocation."""
    lines = [
        f"plan (--plan, power {plan.power:.0%}): the pairs needed, from the measured "
        "discordance (Connor 1987)"
    ]
    per_item = _allocation_per_item(b)
    for s in comparison.strata if len(comparison.strata) > 2 else comparison.strata[-1:]:
        name = "overall" if s.stratum == OVERALL else f"stratum {s.stratum}"
        lines.append(f" {name}:")
        needed = list(_needed_lines(s, max_drop, plan.power, plan.drop))
        lines += needed
    overall = comparison.overall
    n = overall.table.n
    drop = (
        plan.drop
        if plan.drop is not None
        else ((overall.table.lost - overall.table.gained) / n if n else 0.0)
    )
    discordance = overall.table.discordant / n if n else 0.0
    pairs = (
        pairs_needed(
            drop,
            discordance,
            max_drop=0.0,
            confidence=overall.difference.confidence,
            power=plan.power,
        )
        if drop > 0
        else None
    )
    if pairs is None:
        return lines
    if per_item is None:
        lines.append("  cost: B's runs left no timeline, so no allocation per item is known")
        return lines
    hours, gpu_hours, items = per_item
    both = 2 * pairs  # each pair is an item on each side
    more = max(0, both - 2 * n)
    if gpu_hours is not None:
        rate = f"{gpu_hours / items:.4f} GPU-h per item ({gpu_hours:.2f} GPU-h for {items:,})"
        spent = f"{more * gpu_hours / items:.2f} GPU-h"
    else:
        rate = (
            f"{3600 * hours / items:.2f} s of allocation per item ({hours:.3f} h for "
            f"{items:,}, no GPUs recorded)"
        )
        spent = f"{more * hours / items:.2f} h of allocation, 0 GPU-h"
    lines.append(
        f"  cost: {pairs:,} pairs are {both:,} items, {more:,} more than the {2 * n:,} now; "
        f"at B's measured {rate}: {spent} more"
    )
    return lines


def _allocation_per_item(results: Results) -> tuple[float, float | None, int] | None:
    """B's runs' allocation hours and GPU-hours and the records they wrote."""
    runs = build_report(results).runs
    total = totals(read_allocations(runs, samples=False), "B")
    items = sum(run.records for run in runs)
    if total is None or not items:
        return None
    return total.allocation_s / 3600, total.gpu_hours, items


def rate_text(passed: int, n: int, confidence: float = CONFIDENCE) -> str:
    """`95.0% [91.0, 97.3] (190/200)`; without scipy, `95.0% (190/200)`."""
    try:
        return wilson(passed, n, confidence).text()
    except MissingExtraError:
        return f"{100 * passed / n:.1f}% ({passed}/{n})" if n else "- (0/0)"


def interval_note(confidence: float = CONFIDENCE) -> str:
    """What the brackets after a rate are, or what to install for them."""
    try:
        require("scipy", "analysis", "computing the intervals on the pass rates")
    except MissingExtraError as exc:
        return f"pass rates without intervals: {exc}"
    level = f"{100 * confidence:g}%"
    return f"pass rate: items whose newest record completed, [{level} Wilson interval]"
