"""What `haico report` and `haico compare` show, computed from the results API: figures per
arm × stratum, each run's start-up and provenance."""

from __future__ import annotations

import json
import statistics
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from operator import attrgetter, itemgetter, methodcaller
from pathlib import Path
from typing import Any

from pytest_haico.durations import format_duration
from pytest_haico.files import read_results_file
from pytest_haico.ledger.layout import RUN_CONFIG_JSON, ArmPaths
from pytest_haico.ledger.verdicts import MEASURED_VERDICTS, Verdict
from pytest_haico.percentiles import P95, percentile
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
    def passed(self) -> int:
        """Items whose newest record completed."""
        return self.verdicts.get(Verdict.COMPLETED, 0)

    @property
    def gave_up(self) -> int:
        return self.verdicts.get(Verdict.GAVE_UP, 0)

    @property
    def median_s(self) -> float | None:
        return statistics.median(self.durations) if self.durations else None

    @property
    def p95_s(self) -> float | None:
        return percentile(self.durations, P95)

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
    for 100,000 records: they count in C where they can, and read record data directly)."""
    newest = results.newest()
    attempts = results.attempts
    cells: dict[tuple[str, str], Cell] = {}
    kinds = Counter(
        zip(map(_ARM, attempts), map(_STRATUM, attempts), results.attempt_kinds(), strict=True)
    )
    for (arm, stratum, kind), number in kinds.items():
        cell = cells.get((arm, stratum)) or cells.setdefault((arm, stratum), Cell(arm, stratum))
        if kind == RETRY:
            cell.retries += number
        elif kind == RERUN:
            cell.reruns += number
    by_cell: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for record in newest:
        by_cell.setdefault((record.arm, record.stratum), []).append(record.data)
    recorded = False
    for key, datas in by_cell.items():
        recorded |= _add_newest(cells[key], datas)
    runs = list(_runs(attempts))
    ordered = [cells[key] for key in sorted(cells)]
    return Report(results, ordered, runs, newest, recorded)


_ARM, _ARM_DIR, _RUN_ID = attrgetter("arm"), attrgetter("arm_dir"), attrgetter("run_id")
_STRATUM, _STARTED_AT = attrgetter("stratum"), attrgetter("started_at")
_VERDICT, _DURATION = itemgetter("verdict"), methodcaller("get", "duration_s")


def _add_newest(cell: Cell, datas: list[dict[str, Any]]) -> bool:
    """Count the newest records' `datas` into `cell`; whether one has `adaptations`."""
    cell.items += len(datas)
    verdicts = list(map(_VERDICT, datas))
    cell.verdicts = dict(Counter(verdicts))
    cell.durations = [
        float(duration)
        for verdict, duration in zip(verdicts, map(_DURATION, datas), strict=True)
        if verdict in MEASURED_VERDICTS and isinstance(duration, int | float)
    ]
    turns_count = tokens_in = tokens_out = 0
    recorded = False
    for data in datas:
        turns = data.get("turns")
        if type(turns) is list:
            turns_count += len(turns)
            for turn in turns:
                if type(turn) is dict:
                    tokens_in += turn.get("tokens_in") or 0
                    tokens_out += turn.get("tokens_out") or 0
        adaptations = data.get("adaptations")
        if adaptations is not None:
            recorded = True
            cell.adaptations += len(adaptations) if isinstance(adaptations, list) else 1
    cell.turns, cell.tokens_in, cell.tokens_out = turns_count, tokens_in, tokens_out
    return recorded


def _runs(attempts: list[Attempt]) -> Iterable[RunInfo]:
    starts: dict[tuple[Path, str], list[str | None]] = {}  # each run's attempts' starts
    runs = zip(map(_ARM_DIR, attempts), map(_RUN_ID, attempts), strict=True)
    for key, started in zip(runs, map(_STARTED_AT, attempts), strict=True):
        run_starts = starts.get(key)
        if run_starts is None:
            starts[key] = [started]
        else:
            run_starts.append(started)
    first = {key: min(filter(None, run), default="") for key, run in starts.items()}
    for (arm_dir, run_id), started in sorted(first.items()):
        count = len(starts[(arm_dir, run_id)])
        run_dir = ArmPaths(arm_dir).run_dir(run_id)
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
        data = json.loads(read_results_file(run_dir / RUN_CONFIG_JSON))
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
