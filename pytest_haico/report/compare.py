"""`haico compare A B`: per script and repeat, how B's newest records differ from A's —
verdict changes (regressions first), the expectations that passed on one side only, latency
and token deltas — and the run-config keys that differ.

An operand is a campaign directory, an arm directory, a run directory
(`<arm>/runs/<run_id>`), a run's ledger (`<arm>/ledger/<run_id>.jsonl`), or a campaign or
arm directory and a run: `DIR@RUN_ID`, `DIR@latest` (DIR's newest run, by start) or
`DIR@previous` (DIR before its newest run: every earlier run, each item's newest record
among them, so that `DIR@previous DIR@latest` pairs every item the newest run ran again).
A path that is not there from the working directory is looked up under the results root.
The header names each side's runs and their start, and lists the items only one side has.
Items are matched by arm, script and repeat when both sides hold the same arms, else (one
arm each, e.g. two arms of one campaign) by script and repeat.
"""

from __future__ import annotations

import contextlib
import json
import statistics
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from pytest_haico.files import read_results_file, shown_path
from pytest_haico.ledger.layout import CLAIM_FILE, ArmPaths
from pytest_haico.ledger.verdicts import MEASURED_VERDICTS, Verdict
from pytest_haico.report.data import read_run_config, seconds, turn_totals
from pytest_haico.report.paired import Gate, Plan, statistics_lines
from pytest_haico.report.terminal import Say, table
from pytest_haico.results import Record, Results, ResultsReadError, load_results
from pytest_haico.results.stats import CONFIDENCE, Decision
from pytest_haico.stamps import utc_shown

Key = tuple[str, str, int]

# Run-config keys that differ between any two runs (ports, paths, job ids), not compared.
_VOLATILE_SUFFIXES = ("_PORT", "_SOURCE", "_DIR", "_URL")
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
    """`DIR@RUN_ID`, `DIR@latest`, `DIR@previous` (every run before the newest), or any path
    `load_results` reads."""
    path, at, run = operand.rpartition("@")
    if not (at and path and run and "/" not in run):
        return load_results(operand)
    results = load_results(path)
    order = [run_id for run_id, _ in run_starts(results)]
    if run == "previous":
        if len(order) < 2:
            raise ResultsReadError(
                f"{path} holds one run ({', '.join(order)}), so there is no previous run: "
                f"run the campaign again, or compare with {path}@{order[-1]}"
            )
        kept = set(order[:-1])  # what the campaign held before its newest run
    elif run == "latest":
        kept = {order[-1]}
    elif run in order:
        kept = {run}
    else:
        raise ResultsReadError(
            f"{path} holds no run {run!r}: its runs are {', '.join(order)} "
            f"(or give {path}@latest or {path}@previous)"
        )
    return Results(
        results.path,
        [r for r in results.records if r.run_id in kept],
        [o for o in results.orphans if o.run_id in kept],
        results.warnings,
    )


def run_starts(results: Results) -> list[tuple[str, datetime | None]]:
    """The runs `results` holds, each with its start, ordered by start (unknown first, then
    by id): the run's claim of its directory (`runs/<run_id>/claim.json`), else its first
    item's start."""
    starts: dict[str, list[datetime]] = {}
    for arm_dir, run_id in {(r.arm_dir, r.run_id) for r in results.records}:
        claimed = _claimed_at(ArmPaths(arm_dir).run_dir(run_id))
        starts.setdefault(run_id, []).extend([claimed] if claimed else [])
    for record in results.records:
        started = record.data.get("started_at")
        if not starts[record.run_id] and isinstance(started, str):
            with contextlib.suppress(ValueError):
                starts[record.run_id].append(_aware(datetime.fromisoformat(started)))
    firsts = {run_id: min(values, default=None) for run_id, values in starts.items()}
    floor = datetime.min.replace(tzinfo=UTC)
    return sorted(firsts.items(), key=lambda item: (item[1] or floor, item[0]))


def _aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _claimed_at(run_dir: Path) -> datetime | None:
    try:
        claim = json.loads(read_results_file(run_dir / CLAIM_FILE))
        return datetime.fromtimestamp(float(claim["claimed_at"]), UTC)
    except (OSError, ValueError, KeyError, TypeError, OverflowError):
        return None


def describe(label: str, results: Results) -> str:
    """A header line: the side's path, its runs with their start, its item count."""
    runs = run_starts(results)
    shown = [
        f"{run_id} (started {utc_shown(start) if start else 'unknown'})"
        for run_id, start in runs[:_TOP]
    ]
    more = f" and {len(runs) - _TOP} more" if len(runs) > _TOP else ""
    return (
        f"{label}: {'run' if len(runs) == 1 else f'{len(runs)} runs'} {', '.join(shown)}{more}"
        f" in {shown_path(results.path)} ({len(results.newest()):,} items)"
    )


def pair_items(a: Results, b: Results) -> tuple[list[Pair], list[Record], list[Record]]:
    """Matched pairs, and the records only A and only B have."""
    by_arm = {r.arm for r in a.records} == {r.arm for r in b.records}

    def index(results: Results) -> dict[Key, Record]:
        return {(r.arm if by_arm else "", r.script, r.repeat): r for r in results.newest()}

    left, right = index(a), index(b)
    pairs = [Pair(key, left[key], right[key]) for key in sorted(left.keys() & right.keys())]
    only_a = [left[key] for key in sorted(left.keys() - right.keys())]
    only_b = [right[key] for key in sorted(right.keys() - left.keys())]
    return pairs, only_a, only_b


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
        describe("A", a),
        describe("B", b),
        f"{len(pairs):,} script × repeat on both sides; {len(only_a)} only in A, "
        f"{len(only_b)} only in B",
        *_only_lines("A", only_a),
        *_only_lines("B", only_b),
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
    lines += expectation_lines(pairs)
    lines.append("")
    lines += _delta_lines(pairs)
    lines.append("")
    lines += provenance_lines(a, b)
    return lines, len(regressions)


@dataclass(frozen=True)
class Printed:
    """What `print_comparison` printed: the regressions (the strict per-item rule), the
    records read (the caller decides when they are let go), the gate's decision."""

    regressions: int
    sides: list[Results]
    decision: Decision | None


def print_comparison(
    a: str,
    b: str,
    *,
    say: Say,
    warn: Say,
    gate: Gate | None = None,
    plan: Plan | None = None,
    pass_rule: str | None = None,
    confidence: float = CONFIDENCE,
) -> Printed:
    """Print how operand `b` differs from operand `a` (`load_operand`), then the paired
    statistics, the gate's line and the plan (`pytest_haico.report.paired`)."""
    sides = [load_operand(a), load_operand(b)]
    for label, results in zip("AB", sides, strict=True):
        for message in results.warnings[:5]:
            warn(f"ledger warning ({label}): {message}")
    stats = statistics_lines(
        *sides, gate=gate, plan=plan, pass_rule=pass_rule, confidence=confidence
    )
    lines, regressions = compare_lines(*sides)
    for line in [*lines, "", *stats.lines]:
        say(line)
    return Printed(regressions, sides, stats.decision)


def _expectations(record: Record) -> dict[tuple[int, str, str], tuple[bool, str]]:
    """Each checked expectation of the record: (turn, key, expected) -> (passed, seen)."""
    found = {}
    for turn in record.turns:
        index = turn.get("index")
        results = turn.get("expectations")
        for result in results if isinstance(results, list) else ():
            if isinstance(result, dict) and isinstance(index, int):
                expected = json.dumps(result.get("expected"), ensure_ascii=False)
                where = (index, str(result.get("expectation")), expected)
                found[where] = (bool(result.get("passed")), str(result.get("seen", "")))
    return found


def expectation_lines(pairs: list[Pair]) -> list[str]:
    """The expectations checked on both sides that passed on one side only (turns from 1)."""
    changes = []
    for pair in pairs:
        a, b = _expectations(pair.a), _expectations(pair.b)
        changes += [
            (pair.key, at, b[at]) for at in sorted(a.keys() & b.keys()) if a[at][0] != b[at][0]
        ]
    failing = sum(1 for _, _, (passed, _) in changes if not passed)
    lines = [
        f"expectation changes: {failing} passed in A and fail in B, {len(changes) - failing} "
        "failed in A and pass in B"
    ]
    for key, (turn, name, expected), (passed, seen) in changes[:_TOP]:
        change = "A fail → B pass" if passed else f"A pass → B FAIL (seen: {seen})"
        lines.append(f"  {_name(key)} turn {turn + 1}: expect {name} {expected}: {change}")
    if len(changes) > _TOP:
        lines.append(f"  and {len(changes) - _TOP} more")
    return lines


def _only_lines(label: str, records: list[Record]) -> Iterator[str]:
    """The items one side only has, the first `_TOP`: item id and test id."""
    for record in records[:_TOP]:
        nodeid = record.data.get("nodeid")
        test = f"  {nodeid}" if isinstance(nodeid, str) else ""
        yield f"  only in {label}: {record.item_id}{test}"
    if len(records) > _TOP:
        yield f"  only in {label}: and {len(records) - _TOP} more"


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
        for key, value in read_run_config(ArmPaths(arm_dir).run_dir(run_id)).items():
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
