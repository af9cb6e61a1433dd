"""Where each run's allocation went, as its `timeline.json` says (the shares are the
timeline's own `shares`; the model's idle share is the sampler's summary in it), the model's
sampled load from its `model-metrics.csv`, and the totals per arm and for the campaign."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from pytest_haico.durations import format_duration
from pytest_haico.files import NotAnInputError, read_results_file
from pytest_haico.ledger.model_metrics import FILE_NAME as METRICS_FILE
from pytest_haico.ledger.model_metrics import Sample, read_csv
from pytest_haico.ledger.timeline import FILE_NAME as TIMELINE_FILE
from pytest_haico.ledger.timeline import shares as timeline_shares
from pytest_haico.report.data import RunInfo

PARTS = ("starting", "conversing", "draining", "dumping")


@dataclass
class RunAllocation:
    """One run's figures: `shares` is `ledger.timeline.shares` of its timeline (None
    without a readable one), `model` the timeline's `model` section, `samples` the rows of
    its model-metrics.csv, `problems` one line per file that could not be read."""

    arm: str
    run_id: str
    # The pytest session (host:pid and its start) whose allocation the run spent: the runs
    # of the arms one session ran share it.
    session: tuple[str, float] | None = None
    shares: dict[str, Any] | None = None
    model: dict[str, Any] | None = None
    samples: list[Sample] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Totals:
    """The runs of one arm (or the whole campaign) together: allocation time and GPU-hours
    summed over their sessions (runs of one session share its allocation: counted once),
    each share the runs' time in it over that sum, the model's idle share and mean requests
    running weighted by sample count."""

    label: str
    runs: int
    allocation_s: float
    gpu_hours: float | None
    shares: dict[str, float]
    idle_share: float | None
    mean_running: float | None
    bottlenecks: tuple[str, ...]

    def line(self) -> str:
        """`allocation 20 s: starting 37%, …; model idle 80% …` (as the run's summary)."""
        gpu = f" ({self.gpu_hours:.2f} GPU-h)" if self.gpu_hours is not None else ""
        parts = ", ".join(f"{name} {self.shares[name]:.0%}" for name in PARTS)
        text = f"allocation {format_duration(self.allocation_s)}{gpu}: {parts}"
        if self.idle_share is not None:
            text += (
                f"; model idle {self.idle_share:.0%} of conversing time with items remaining, "
                f"{self.mean_running:.2g} requests running on average"
            )
        if self.bottlenecks:
            text += "; bottleneck: " + ", ".join(self.bottlenecks)
        return text


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def read_allocation(run: RunInfo, *, samples: bool = True) -> RunAllocation:
    """The run's timeline figures and (with `samples`) its model samples, each file
    optional; a damaged file is one problem line naming it, never an exception."""
    found = RunAllocation(run.arm, run.run_id)
    path = run.run_dir / TIMELINE_FILE
    try:
        doc = json.loads(read_results_file(path))
        if not isinstance(doc, dict):
            raise TypeError(f"a {type(doc).__name__}, not an object")
        found.shares = timeline_shares(doc)
        found.session = (str(doc.get("session")), _number(doc.get("process_started_at")) or 0.0)
        model = doc.get("model")
        if isinstance(model, dict) and _number(model.get("idle_share")) is not None:
            found.model = model
    except FileNotFoundError:
        pass
    except (OSError, ValueError, TypeError, AttributeError) as exc:
        problem = f"{path}: unreadable ({_why(exc)}); its run's allocation is not counted"
        found.problems.append(problem)
    csv_path = run.run_dir / METRICS_FILE
    if not samples:
        return found
    try:
        found.samples, damaged = read_csv(read_results_file(csv_path).decode("utf-8"))
        if damaged:
            found.problems.append(f"{csv_path}: {damaged} damaged row(s) skipped")
    except FileNotFoundError:
        pass
    except (OSError, ValueError, TypeError, KeyError) as exc:
        found.problems.append(f"{csv_path}: unreadable ({_why(exc)}); its samples are not plotted")
    return found


def _why(exc: Exception) -> str:
    return exc.problem if isinstance(exc, NotAnInputError) else repr(exc)


def read_allocations(runs: Iterable[RunInfo], *, samples: bool = True) -> list[RunAllocation]:
    return [read_allocation(run, samples=samples) for run in runs]


def totals(allocations: list[RunAllocation], label: str) -> Totals | None:
    """The runs' totals, None when none left a readable timeline."""
    timed = [(a, a.shares) for a in allocations if a.shares and a.shares["allocation_s"] > 0]
    if not timed:
        return None
    sessions: dict[object, tuple[float, float]] = {}
    for run, got in timed:
        key = run.session or run.run_id
        spent_gpu = (got["allocation_s"], got["gpu_hours"] or 0.0)
        sessions[key] = max(sessions.get(key, spent_gpu), spent_gpu)
    spent = sum(s for s, _ in sessions.values())
    gpu = sum(g for _, g in sessions.values())
    shares = {
        name: min(sum(got[name] * got["allocation_s"] for _, got in timed) / spent, 1.0)
        for name in PARTS
    }
    models = [
        (a.model, _number(a.model.get("samples")) or 1.0)
        for a, _ in timed
        if a.model and a.model.get("idle_share") is not None  # None: no sample while conversing
    ]
    weight = sum(w for _, w in models)
    idle = mean = None
    if models:
        idle = sum(float(m["idle_share"]) * w for m, w in models) / weight
        mean = sum((_number(m.get("mean_running")) or 0.0) * w for m, w in models) / weight
    bottlenecks = sorted({str(m["bottleneck"]) for m, _ in models if m.get("bottleneck")})
    return Totals(label, len(timed), spent, gpu or None, shares, idle, mean, tuple(bottlenecks))


def iter_totals(allocations: list[RunAllocation]) -> Iterator[Totals]:
    """Each arm's totals, then the campaign's when it has more than one arm."""
    arms = sorted({a.arm for a in allocations})
    for arm in arms:
        got = totals([a for a in allocations if a.arm == arm], arm)
        if got is not None:
            yield got
    if len(arms) > 1:
        got = totals(allocations, "campaign")
        if got is not None:
            yield got


def allocation_lines(report_runs: list[RunInfo]) -> Iterator[str]:
    """The terminal report's lines: one per arm (and the campaign), and each problem."""
    allocations = read_allocations(report_runs, samples=False)
    for total in iter_totals(allocations):
        runs = f"{total.runs} run(s)"
        yield f"where the allocation went, {total.label} ({runs} with a timeline): {total.line()}"
    for allocation in allocations:
        yield from allocation.problems
