"""The cost model behind `haico cost`: what a campaign's remaining items will take, from
what its ledgers measured (`item_costs`), and the array size and `--time` to ask Slurm for.

CostError                 the report cannot be made (no campaign, no ledgers yet)
└── ItemLongerThanCapError a measured item alone outlasts the partition's cap
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pytest_haico.config.concurrency import resolve_concurrency
from pytest_haico.config.experiment import Arm, Experiments, load_experiments
from pytest_haico.config.items import submitted_item_specs
from pytest_haico.config.settings import Profile
from pytest_haico.durations import DAY, MINUTE, format_duration
from pytest_haico.errors import ConfigError
from pytest_haico.report.item_costs import CostError, StratumCost, current_items, load_costs
from pytest_haico.report.nodes import NODE_FIELDS, node_lines
from pytest_haico.results import load_results
from pytest_haico.slurm.timelimits import (
    Partition,
    format_time_limit,
    parse_time_limit,
    resolve_partition,
)

Warn = Callable[[str], None]

MIN_ITEMS = 5  # measured items a stratum needs before its cost is projected
TREND_WARN = 1.2  # late/early factor above which the report warns of a rising cost
SIGNAL_LEAD_S = 300.0  # sbatch/campaign.sbatch: --signal=B:USR1@300
EARLY_SIGNAL_S = 60.0  # Slurm may send the signal up to a minute early
# After the drain: the final pg_dump, the stack's stop and the ledger's last records.
SHUTDOWN_S = 120.0
OVERHEAD_S = SIGNAL_LEAD_S + EARLY_SIGNAL_S + SHUTDOWN_S
# The walltimes asked for: a short ladder keeps jobs comparable and backfill-friendly.
LADDER_S = tuple(
    m * MINUTE for m in (15, 30, 60, 120, 240, 480, 720, 1440, 2 * 1440, 3 * 1440, 7 * 1440)
)


class ItemLongerThanCapError(CostError):
    """A measured item alone takes longer than the partition's cap leaves for work."""


# -- The plan ----------------------------------------------------------------------------


@dataclass(frozen=True)
class ArrayPlan:
    """The array to submit for one arm × stratum's remaining items.

    `per_task_work_s` is the measured work of one task's share (no margin, no overheads);
    `walltime_s` that work times the margin plus the stack's measured start-up and
    `OVERHEAD_S`; `time_s` the bucket of the
    partition it rounds up to, as `time_limit` for `sbatch --time`.
    """

    tasks: int
    time_s: float
    time_limit: str
    per_task_work_s: float
    partition: Partition | None
    items_per_task: int
    walltime_s: float
    margin_trimmed: bool  # the margin did not fit under the cap; the measured work does

    @property
    def array(self) -> str:
        return f"0-{self.tasks - 1}"


def plan_array(
    cost: StratumCost,
    remaining: int,
    *,
    concurrency: int,
    partition: Partition | None,
    margin: float = 1.5,
    min_items: int = MIN_ITEMS,
) -> ArrayPlan:
    """The fewest tasks whose share, at the measured cost, fits a bucket of the partition.

    A task's work is its items × `cost.per_item_s` / `concurrency`, never less than the
    longest measured item; its walltime that work × `margin` + the arm's measured stack
    start-up (`cost.startup_s`) + `OVERHEAD_S`, rounded up
    into the ladder below the partition's cap, or the cap. Work beyond the cap is spread
    over more tasks; a walltime is never below the measured work.

    Callers check `cost.n >= min_items` and `remaining >= 1` first: anything less is a
    `ValueError`, as are `concurrency < 1` and `margin < 1`. An item longer than the cap
    leaves for work is an `ItemLongerThanCapError`.
    """
    if cost.n < max(1, min_items) or cost.max_s is None:
        raise ValueError(f"{cost.n} measured items are too few to plan (need {min_items})")
    if remaining < 1 or concurrency < 1 or not 1 <= margin < math.inf:
        raise ValueError(f"{remaining=}, {concurrency=} and {margin=} must be at least 1")
    longest, per_item = cost.max_s, cost.per_item_s
    overhead = OVERHEAD_S + (cost.startup_s or 0.0)
    cap = partition.cap_s if partition is not None else None
    if partition is not None and cap is not None and longest > cap - overhead:
        raise ItemLongerThanCapError(
            f"arm {cost.arm}, stratum {cost.stratum}: an item took {longest:.1f} s, longer "
            f"than the {cap - overhead:.0f} s that partition {partition.name}'s cap "
            f"{format_time_limit(cap)} leaves after {overhead:.0f} s of stack start-up, "
            "signal lead, early signal and shutdown: choose a partition with a longer cap ([slurm] "
            f"partition in arms/{cost.arm}.toml) or split the stratum's longest scripts"
        )
    top = cap if cap is not None else max(LADDER_S[-1], longest * margin + overhead)
    budget = top - overhead
    # The most items one task can take with the margin, at least one.
    fits = math.floor(budget / margin * concurrency / per_item + 1e-9) if per_item else remaining
    tasks = math.ceil(remaining / max(1, min(fits, remaining)))
    items = math.ceil(remaining / tasks)
    work = max(items * per_item / concurrency, longest)
    trimmed = work * margin > budget
    walltime = min(work * margin, budget) + overhead
    bucket = _bucket(walltime, cap)
    return ArrayPlan(
        tasks, bucket, format_time_limit(bucket), work, partition, items, walltime, trimmed
    )


def _bucket(walltime_s: float, cap_s: float | None) -> float:
    """The smallest rung of the ladder below the cap, or the cap, that holds `walltime_s`;
    past the ladder with no cap, whole days."""
    rungs = [rung for rung in LADDER_S if cap_s is None or rung < cap_s]
    rungs += [cap_s] if cap_s is not None else []
    fitting = (rung for rung in rungs if rung >= walltime_s - 1e-9)
    return next(fitting, math.ceil(walltime_s / DAY) * DAY)


# -- The report --------------------------------------------------------------------------


def cost_lines(
    campaign_dir: Path,
    experiments_dir: Path | None,
    *,
    concurrency: int | None,
    margin: float,
    partitions: list[Partition] | None,
    warn: Warn,
    profile: Profile = Profile.LOCAL,
    site_image: str | None = None,
) -> list[str]:
    """The `haico cost` report: a few lines per arm × stratum, every figure with its unit.

    The current items are the experiments' items with the ids a `haico submit` job of
    `profile` gives them (`submitted_item_specs`); remaining items are those minus the
    current items whose newest record is terminal. Records of other item ids (a script or
    arm edited since they ran) are stale: neither done nor measured, since an item's id
    changes exactly when something that makes its result, and so its time, changes.
    `partitions` None means sinfo was unavailable: the plans then have no cap.
    `concurrency` overrides each arm's `run.concurrency`.
    """
    if not 1 <= margin < math.inf:
        raise ConfigError("--margin", "", f"must be at least 1 (no margin), got {margin}")
    if concurrency is not None and concurrency < 1:
        raise ConfigError("--concurrency", "", f"must be at least 1, got {concurrency}")
    experiments = load_experiments(experiments_dir) if experiments_dir is not None else None
    current = None
    if experiments is not None:
        current = current_items(submitted_item_specs(experiments, profile, site_image=site_image))
    costs = load_costs(campaign_dir, warn=warn, current=current)
    planned: dict[str, int] = {}
    keys = set(costs)
    if experiments is not None:
        for source in experiments.scripts:
            stratum = source.script.stratum
            planned[stratum] = planned.get(stratum, 0) + source.script.repeats
        keys |= {(arm, stratum) for arm in experiments.arms for stratum in planned}
    lines = _header(campaign_dir, experiments_dir, margin, profile)
    if partitions is None:
        lines.append("sinfo unavailable: partition caps unknown, planned without a cap")
    for arm, stratum in sorted(keys):
        cost = costs.get((arm, stratum)) or StratumCost.from_times(arm, stratum, [], 0)
        lines += _stratum_lines(
            cost,
            campaign_dir,
            experiments,
            planned,
            concurrency=concurrency,
            margin=margin,
            partitions=partitions,
        )
    # Where records name several nodes, their failures and item times side by side.
    results = load_results(campaign_dir, warn=None, newest_only=True, fields=NODE_FIELDS)
    by_node = list(node_lines(results))
    return [*lines, "", *by_node] if by_node else lines


def _header(
    campaign_dir: Path, experiments_dir: Path | None, margin: float, profile: Profile
) -> list[str]:
    source = (
        f"remaining items from {experiments_dir} (the {profile} profile's item ids: records "
        "of scripts or arms edited since are stale, not counted)"
        if experiments_dir is not None
        else "no --experiments: remaining items unknown, no array plans"
    )
    return [
        f"campaign {campaign_dir}: {source}",
        f"--time = measured work per task x{margin:g} (--margin) + the arm's measured stack "
        f"start-up + {SIGNAL_LEAD_S:.0f} s "
        f"signal lead + {EARLY_SIGNAL_S:.0f} s early signal + {SHUTDOWN_S:.0f} s dump and "
        "shutdown, rounded up to a bucket of the partition",
    ]


def _stratum_lines(
    cost: StratumCost,
    campaign_dir: Path,
    experiments: Experiments | None,
    planned: dict[str, int],
    *,
    concurrency: int | None,
    margin: float,
    partitions: list[Partition] | None,
) -> list[str]:
    head = f"arm {cost.arm}, stratum {cost.stratum}"
    figures = [_figures(cost)] if cost.n else []
    arm = experiments.arms.get(cost.arm) if experiments is not None else None
    if experiments is None or arm is None or cost.stratum not in planned:
        why = (
            "no --experiments"
            if experiments is None
            else f"no arms/{cost.arm}.toml in {experiments.root}"
            if arm is None
            else f"no script of this stratum in {experiments.root}"
        )
        rate = f"{cost.per_item_s:.1f} s/item from {cost.n} items" if cost.n else "0 measured"
        return [f"{head}: {rate}, {cost.done} done; remaining unknown ({why})", *figures]
    total = planned[cost.stratum]
    remaining = max(0, total - cost.done)
    stale = f"; {_many(cost.stale, 'stale item')} not counted" if cost.stale else ""
    progress = f"remaining {remaining} of {total} items ({cost.done} done{stale})"
    if remaining == 0:
        return [f"{head}: all {total} items done, from {cost.n} items: nothing to submit", *figures]
    partition, note = resolve_partition(arm, partitions)
    workers = concurrency if concurrency is not None else resolve_concurrency(None, arm.run).maximum
    if cost.n < MIN_ITEMS:
        advice = _too_few(cost, campaign_dir, remaining, workers, partition, margin)
        return [
            f"{head}: too few items to project: {cost.n} measured, need {MIN_ITEMS}; {advice}",
            *figures,
            f"  {progress}",
        ]
    plan = plan_array(cost, remaining, concurrency=workers, partition=partition, margin=margin)
    where = f"partition {partition.name}" if partition else "the default partition"
    cap = partition.cap_text if partition else "cap unknown"
    lines = [
        f"{head}: {format_duration(plan.per_task_work_s, 'decimal')}/task on {where} ({cap}), "
        f"from {cost.n} items: ask --array={plan.array} --time={plan.time_limit}",
        *figures,
    ]
    if note:
        lines.append(f"  note: {note}")
    trend = cost.trend
    if trend is not None and trend > TREND_WARN:
        lines.append(
            f"  warning: cost rises with item order (late/early {trend:.2f}x > {TREND_WARN}x): "
            f"projected at the late-third mean {cost.late_mean_s:.1f} s/item"
        )
    at_most = "<= " if plan.tasks > 1 else ""
    per_task = f"{_many(plan.tasks, 'task')} of {at_most}{_many(plan.items_per_task, 'item')}"
    padded = "cap (margin trimmed to fit)" if plan.margin_trimmed else f"x{margin:g} margin"
    lines.append(
        f"  {progress}: {remaining} x {cost.per_item_s:.1f} s/item / concurrency {workers} = "
        f"{format_duration(remaining * cost.per_item_s / workers, 'decimal')} of work; "
        f"{per_task}: "
        f"{format_duration(plan.per_task_work_s, 'decimal')} {padded} + "
        + (f"{cost.startup_s:.0f} s start-up + " if cost.startup_s else "")
        + f"{OVERHEAD_S:.0f} s = "
        f"{format_duration(plan.walltime_s, 'decimal')}/task"
    )
    lines += _configured_time(arm, cost.stratum, plan)
    return lines


def submit_command(campaign_dir: Path, stage: str, arm: str, stratum: str, *more: str) -> str:
    """The `haico submit` command line of one arm × stratum's stage, quoted for a shell."""
    argv = ["haico", "submit", str(campaign_dir), "--stage", stage]
    return shlex.join([*argv, "--arm", arm, "--stratum", stratum, *more])


def _too_few(
    cost: StratumCost,
    campaign_dir: Path,
    remaining: int,
    workers: int,
    partition: Partition | None,
    margin: float,
) -> str:
    """What to run when too few items are measured: the smoke stage when none is, else the
    full stage with the walltime and tasks the few measured give, to choose knowingly."""
    if not cost.n:
        smoke = submit_command(campaign_dir, "smoke", cost.arm, cost.stratum)
        return f"measure some first: {smoke}"
    try:
        plan = plan_array(
            cost, remaining, concurrency=workers, partition=partition, margin=margin, min_items=1
        )
    except ItemLongerThanCapError as exc:
        return str(exc)
    full = submit_command(
        campaign_dir,
        "full",
        cost.arm,
        cost.stratum,
        "--time",
        plan.time_limit,
        "--tasks",
        str(plan.tasks),
    )
    return f"to submit on these {_many(cost.n, 'item')} alone: {full}"


def _figures(cost: StratumCost) -> str:
    trend = cost.trend
    return (
        f"  median {cost.median_s:.1f} s/item, p95 {cost.p95_s:.1f} s/item, "
        f"max {cost.max_s:.1f} s/item, mean {cost.mean_s:.1f} s/item, late/early "
        + (f"{trend:.2f}x" if trend is not None else "n/a (under 3 items)")
    )


def _configured_time(arm: Arm, stratum: str, plan: ArrayPlan) -> list[str]:
    """A warning when the arm's own `[slurm]` time for the stratum is below the plan's."""
    section = arm.slurm
    key = f"time_per_stratum.{stratum}"
    text = section.time_per_stratum.get(stratum) if section else None
    if section is not None and text is None:
        key, text = "time", section.time
    if text is None:
        return []
    # The arm's loader refused a time Slurm cannot read (`config.bounds.SlurmTime`).
    seconds = parse_time_limit(text, where=f"arms/{arm.name}.toml [slurm] {key}")
    if seconds is None or seconds >= plan.walltime_s:
        return []
    return [
        f"  warning: [slurm] {key} = {text} in arms/{arm.name}.toml is below the "
        f"{format_duration(plan.walltime_s, 'decimal')} a task needs: its last items would be "
        "cut at the walltime"
    ]


def _many(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"
