"""What `haico report` and `haico compare` show, computed from the results API: figures per
arm × stratum, each run's start-up and provenance."""

from __future__ import annotations

import json
import math
import statistics
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_haico.durations import format_duration
from pytest_haico.ledger.verdicts import MEASURED_VERDICTS, Verdict
from pytest_haico.report.run_startup import run_startup_s
from pytest_haico.results import RERUN, RETRY, Attempt, Record, Results

# The order verdicts are shown in: the good, the model's failures, then the infra's.
VERDICT_ORDER = (
    Verdict.COMPLETED,
    Verdict.EXPECTATION_FAILED,
    Verdict.BLANK_TURN,
    Verdict.RECURSION_LIMIT,
    Verdict.SUBSTITUTED,
    Verdict.GAVE_UP,
    Verdict.INFRA_ERROR,
    Verdict.RATE_LIMITED,
    Verdict.INTERRUPTED,
)
# Run-config keys shown as each run's provenance, in this order, when present.
PROVENANCE_KEYS = (
    "NODE",
    "HARNESS_VERSION",
    "MODEL_IDENTITY",
    "BACKEND_IDENTITY",
    "MODEL_SERVER",
    "MODEL_SERVER_VERSION",
    "VLLM_VERSION",
    "POSTGRES_VERSION",
    "EXPERIMENTS_GIT_COMMIT",
    "EXPERIMENTS_GIT_DIRTY",
    "GPUS",
)


def percentile(values: list[float], share: float) -> float | None:
    """Nearest-rank percentile (as `haico cost`); None for no values."""
    if not values:
        return None
    ranked = sorted(values)
    return ranked[max(math.ceil(share * len(ranked)) - 1, 0)]


def turn_totals(record: Record) -> tuple[int, float, int, int]:
    """Turns, latency seconds, tokens in and tokens out of one record's turns."""
    latency = 0.0
    tokens_in = tokens_out = 0
    turns = record.data.get("turns")
    if not isinstance(turns, list):
        return 0, 0.0, 0, 0
    for turn in turns:
        if isinstance(turn, dict):
            latency += turn.get("latency_s") or 0.0
            tokens_in += turn.get("tokens_in") or 0
            tokens_out += turn.get("tokens_out") or 0
    return len(turns), latency, tokens_in, tokens_out


@dataclass
class Cell:
    """The figures of one arm × stratum; verdicts, turns and tokens are of each item's
    newest record; retries and reruns count its records as `Results.attempt_kinds` tells
    them apart (an attempt after an owed one; a record after a done one)."""

    arm: str
    stratum: str
    items: int = 0
    retries: int = 0
    reruns: int = 0
    verdicts: dict[str, int] = field(default_factory=dict)
    turns: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    durations: list[float] = field(default_factory=list)
    adaptations: int = 0

    @property
    def gave_up(self) -> int:
        return self.verdicts.get(Verdict.GAVE_UP, 0)

    @property
    def median_s(self) -> float | None:
        return statistics.median(self.durations) if self.durations else None

    @property
    def p95_s(self) -> float | None:
        return percentile(self.durations, 0.95)

    def verdict_text(self) -> str:
        known = [v for v in VERDICT_ORDER if v in self.verdicts]
        other = sorted(set(self.verdicts) - set(known))
        return ", ".join(f"{self.verdicts[v]} {v}" for v in known + other)


@dataclass
class RunInfo:
    """One run of an arm: its start-up (claim to first item) and run-config values."""

    arm: str
    run_id: str
    records: int
    startup_s: float | None
    config: dict[str, str]
    adaptations: list[str]
    run_dir: Path


@dataclass
class Report:
    results: Results
    cells: list[Cell]
    runs: list[RunInfo]
    newest: list[Record]
    # Whether any record carries an `adaptations` field (schema 2 may add one).
    recorded_adaptations: bool


# What `build_report` reads of a newest record beyond `pytest_haico.results.RECORD_FIELDS`.
REPORT_FIELDS = ("adaptations", "turns.tokens_in", "turns.tokens_out")


def build_report(results: Results) -> Report:
    """The figures of every arm × stratum and every run (its loops are the report's cost
    for 100,000 records: they read the records' data directly)."""
    newest = results.newest()
    cells: dict[tuple[str, str], Cell] = {}
    for attempt, kind in zip(results.attempts, results.attempt_kinds(), strict=True):
        key = (attempt.arm, attempt.stratum)
        cell = cells.get(key) or cells.setdefault(key, Cell(*key))
        cell.retries += kind == RETRY
        cell.reruns += kind == RERUN
    recorded = False
    for record in newest:
        data = record.data
        cell = cells[(record.arm, record.stratum)]
        cell.items += 1
        verdict = data["verdict"]
        cell.verdicts[verdict] = cell.verdicts.get(verdict, 0) + 1
        turns = data.get("turns")
        if type(turns) is list:
            cell.turns += len(turns)
            for turn in turns:
                if type(turn) is dict:
                    cell.tokens_in += turn.get("tokens_in") or 0
                    cell.tokens_out += turn.get("tokens_out") or 0
        duration = data.get("duration_s")
        if verdict in MEASURED_VERDICTS and isinstance(duration, int | float):
            cell.durations.append(float(duration))
        adaptations = data.get("adaptations")
        if adaptations is not None:
            recorded = True
            cell.adaptations += len(adaptations) if isinstance(adaptations, list) else 1
    runs = list(_runs(results.attempts))
    ordered = [cells[key] for key in sorted(cells)]
    return Report(results, ordered, runs, newest, recorded)


def _runs(attempts: Iterable[Attempt]) -> Iterable[RunInfo]:
    first: dict[tuple[Path, str], str] = {}
    counts: Counter[tuple[Path, str]] = Counter()
    for attempt in attempts:
        key = (attempt.arm_dir, attempt.run_id)
        counts[key] += 1
        started = attempt.started_at
        if started is not None and (key not in first or started < first[key]):
            first[key] = started
    for key in counts:
        first.setdefault(key, "")
    for (arm_dir, run_id), started in sorted(first.items()):
        count = counts[(arm_dir, run_id)]
        run_dir = arm_dir / "runs" / run_id
        config = read_run_config(run_dir)
        adaptations = [
            f"{key}={value}"
            for key, value in sorted(config.items())
            if "ADAPT" in key and value not in ("", "[]", "none")
        ]
        yield RunInfo(
            arm_dir.name,
            run_id,
            count,
            run_startup_s(run_dir, started),
            config,
            adaptations,
            run_dir,
        )


def factored_provenance(runs: list[RunInfo]) -> tuple[dict[str, str], list[dict[str, str]]]:
    """The provenance values every run shares (shown once; none for a single run), and
    each run's values besides those, in `PROVENANCE_KEYS` order."""
    configs = [run.config for run in runs if run.config]
    shared = {
        key: configs[0][key]
        for key in PROVENANCE_KEYS
        if len(runs) > 1
        and configs
        and key in configs[0]
        and all(config.get(key) == configs[0].get(key) for config in configs)
    }
    own = [
        {k: run.config[k] for k in PROVENANCE_KEYS if k in run.config and k not in shared}
        for run in runs
    ]
    return shared, own


def read_run_config(run_dir: Path) -> dict[str, str]:
    """`runs/<run_id>/run-config.json`'s values ({} when the run left none)."""
    try:
        data = json.loads((run_dir / "run-config.json").read_bytes())
    except (OSError, ValueError):
        return {}
    values: Any = data.get("values", data) if isinstance(data, dict) else {}
    if not isinstance(values, dict):
        return {}
    return {str(key): str(value) for key, value in values.items()}


def seconds(value: float | None) -> str:
    """A duration for a table: `-` when unknown."""
    return "-" if value is None else format_duration(value, "cell")


def count(value: int) -> str:
    """A count for a table: 12,345 or 1.2M."""
    return f"{value / 1e6:.1f}M" if value >= 10_000_000 else f"{value:,}"
