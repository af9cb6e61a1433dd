"""`haico compare A B`: per script and repeat, how B's newest records differ from A's —
verdict changes (regressions first), latency and token deltas — and the run-config keys
that differ.

An operand is a campaign directory, an arm directory, a run directory
(`<arm>/runs/<run_id>`), a run's ledger (`<arm>/ledger/<run_id>.jsonl`), or a campaign or
arm directory and a run id, `DIR@RUN_ID`. Items are matched by arm, script and repeat
when both sides hold the same arms, else (one arm each, e.g. two arms of one campaign)
by script and repeat.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator
from dataclasses import dataclass

from pytest_haico.ledger.verdicts import MEASURED_VERDICTS, Verdict
from pytest_haico.report.data import read_run_config, seconds, turn_totals
from pytest_haico.report.terminal import table
from pytest_haico.results import Record, Results, load_results

Key = tuple[str, str, int]

# Run-config keys that differ between any two runs (ports, paths, job ids), not compared.
_VOLATILE_SUFFIXES = ("_PORT", "_SOURCE", "_DIR")
_VOLATILE = frozenset(
    {
        "MODEL_ENDPOINT",
        "OPTION_CAMPAIGN",
        "OPTION_RESULTS",
        "OPTION_EXPERIMENTS",
        "OPTION_ITEMS_FILE",
        "OPTION_ATTACH",
        "SLURM_JOB_ID",
        "SLURM_ARRAY_JOB_ID",
        "SLURM_ARRAY_TASK_ID",
        "RUN_ID",
    }
)
_TOP = 10


@dataclass(frozen=True)
class Pair:
    """One script × repeat on both sides (each side's newest record)."""

    key: Key
    a: Record
    b: Record

    @property
    def regression(self) -> bool:
        return self.a.verdict == Verdict.COMPLETED and self.b.verdict != Verdict.COMPLETED

    @property
    def improvement(self) -> bool:
        return self.a.verdict != Verdict.COMPLETED and self.b.verdict == Verdict.COMPLETED

    @property
    def changed(self) -> bool:
        return self.a.verdict != self.b.verdict

    def latency_delta(self) -> float | None:
        a, b = self.a.duration_s, self.b.duration_s
        if a is None or b is None or not {self.a.verdict, self.b.verdict} <= MEASURED_VERDICTS:
            return None
        return b - a


def load_operand(operand: str) -> Results:
    """`DIR@RUN_ID`, or any path `load_results` reads."""
    path, at, run = operand.rpartition("@")
    if at and path and run and "/" not in run:
        return load_results(path, run=run)
    return load_results(operand)


def pair_items(a: Results, b: Results) -> tuple[list[Pair], list[Key], list[Key]]:
    """Matched pairs, and the keys only A and only B have."""
    by_arm = {r.arm for r in a.records} == {r.arm for r in b.records}

    def index(results: Results) -> dict[Key, Record]:
        return {(r.arm if by_arm else "", r.script, r.repeat): r for r in results.newest()}

    left, right = index(a), index(b)
    pairs = [Pair(key, left[key], right[key]) for key in sorted(left.keys() & right.keys())]
    return pairs, sorted(left.keys() - right.keys()), sorted(right.keys() - left.keys())


def _name(key: Key) -> str:
    arm, script, repeat = key
    return f"{arm + ' ' if arm else ''}{script}-r{repeat}"


def _signed(value: float, unit: str = "") -> str:
    return f"{'+' if value >= 0 else '−'}{abs(value):,.2f}{unit}".replace(".00", "")


def _ways(
    label: str, deltas: list[tuple[float, Key]], unit: str, *, b_more: str, b_less: str
) -> Iterator[str]:
    """One summary line each way: the items that went up in B, and those that went down."""
    for word, chosen in (
        (b_more, [d for d in deltas if d[0] > 0]),
        (b_less, [d for d in deltas if d[0] < 0]),
    ):
        if not chosen:
            yield f"{label}: no item {word} in B"
            continue
        largest = max(chosen, key=lambda d: abs(d[0]))
        values = [d[0] for d in chosen]
        yield (
            f"{label}: {len(chosen)} item(s) {word} in B, by {_signed(sum(values), unit)} in "
            f"all (median {_signed(statistics.median(values), unit)}, largest "
            f"{_signed(largest[0], unit)}: {_name(largest[1])})"
        )


def compare_lines(a: Results, b: Results) -> tuple[list[str], int]:
    """The comparison's lines, and the number of regressions."""
    pairs, only_a, only_b = pair_items(a, b)
    regressions = [p for p in pairs if p.regression]
    others = [p for p in pairs if p.changed and not p.regression and not p.improvement]
    improvements = [p for p in pairs if p.improvement]
    lines = [
        f"A: {a.path} ({len(a.newest()):,} items)",
        f"B: {b.path} ({len(b.newest()):,} items)",
        f"{len(pairs):,} script × repeat on both sides; {len(only_a)} only in A, "
        f"{len(only_b)} only in B",
        "",
        f"regressions (completed in A, not in B): {len(regressions)}",
    ]
    rows: list[tuple[str, ...]] = [("item", "A", "B", "latency A", "latency B", "Δ tokens out")]
    changed = regressions + others + improvements
    for pair in changed:
        rows.append(_row(pair))
    if changed:
        groups = [("regression", regressions), ("changed", others), ("improvement", improvements)]
        marks = [""] + [f"  [{label}]" for label, group in groups for _ in group]
        lines += ["  " + line + mark for line, mark in zip(table(rows), marks, strict=True)]
    lines.append(
        f"other verdict changes: {len(others)}; improvements (completed only in B): "
        f"{len(improvements)}; unchanged: {len(pairs) - len(changed)}"
    )
    for pair in regressions:
        lines.append(f"  B's transcript of {_name(pair.key)}: {pair.b.transcript_path}")
    lines.append("")
    lines += _delta_lines(pairs)
    lines.append("")
    lines += provenance_lines(a, b)
    return lines, len(regressions)


def _row(pair: Pair) -> tuple[str, ...]:
    out_a, out_b = turn_totals(pair.a)[3], turn_totals(pair.b)[3]
    return (
        _name(pair.key),
        pair.a.verdict,
        pair.b.verdict,
        seconds(pair.a.duration_s),
        seconds(pair.b.duration_s),
        f"{out_b - out_a:+,}",
    )


def _delta_lines(pairs: list[Pair]) -> Iterator[str]:
    latency = [(d, p.key) for p in pairs if (d := p.latency_delta()) is not None]
    yield (
        f"latency of the {len(latency)} item(s) that ran to their own end on both sides "
        "(item seconds, B − A):"
    )
    yield from (
        "  " + line for line in _ways("latency", latency, " s", b_more="slower", b_less="faster")
    )
    for field, index in (("tokens in", 2), ("tokens out", 3)):
        deltas = [(float(turn_totals(p.b)[index] - turn_totals(p.a)[index]), p.key) for p in pairs]
        total_a = sum(turn_totals(p.a)[index] for p in pairs)
        total_b = sum(turn_totals(p.b)[index] for p in pairs)
        share = f" ({(total_b - total_a) / total_a:+.1%})" if total_a else ""
        yield f"{field}: A {total_a:,} → B {total_b:,}{share}"
        yield from (
            "  " + line
            for line in _ways(field, deltas, "", b_more="used more", b_less="used fewer")
        )
    top = sorted(latency, key=lambda d: -abs(d[0]))[:_TOP]
    if top:
        yield f"largest latency changes (of {len(latency)}):"
        yield from (f"  {_name(key)}: {_signed(delta, ' s')}" for delta, key in top)


def _config_values(results: Results) -> dict[str, set[str]]:
    values: dict[str, set[str]] = {}
    for arm_dir, run_id in sorted({(r.arm_dir, r.run_id) for r in results.records}):
        for key, value in read_run_config(arm_dir / "runs" / run_id).items():
            values.setdefault(key, set()).add(value)
    return values


def provenance_lines(a: Results, b: Results) -> list[str]:
    """The run-config keys whose values differ between A's runs and B's."""
    left, right = _config_values(a), _config_values(b)
    if not left and not right:
        return ["provenance: neither side's runs left a run-config.json"]
    differ = [
        key
        for key in sorted(left.keys() | right.keys())
        if left.get(key) != right.get(key)
        and key not in _VOLATILE
        and not key.endswith(_VOLATILE_SUFFIXES)
    ]
    lines = [
        f"provenance: {len(differ)} run-config key(s) differ (ports, paths and job ids not "
        "compared)"
    ]
    for key in differ:
        shown = [" | ".join(sorted(side.get(key, {"(unset)"}))) for side in (left, right)]
        lines.append(f"  {key}: A {shown[0]}  →  B {shown[1]}")
    return lines
