"""`haico cost`: measured item times from real ledger lines, the array plan, the report."""

from __future__ import annotations

import json
import math
import os
import shlex
import stat
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from pytest_haico.cli.main import _parser, main
from pytest_haico.cli.submit import run_submit
from pytest_haico.config.experiment import load_experiments
from pytest_haico.config.items import submitted_item_specs
from pytest_haico.config.settings import Profile
from pytest_haico.errors import ConfigError, ResultsError
from pytest_haico.ledger.records import ErrorInfo, LedgerRecord, SlurmInfo, TurnRecord, record_line
from pytest_haico.ledger.verdicts import Verdict
from pytest_haico.report import item_costs
from pytest_haico.report.cost import MIN_ITEMS, ItemLongerThanCapError, cost_lines, plan_array
from pytest_haico.report.item_costs import CostError, StratumCost, load_costs
from pytest_haico.slurm.timelimits import (
    Partition,
    format_time_limit,
    parse_sinfo,
    parse_time_limit,
    read_partitions,
)
from tests.ledger.schema_lines import SCHEMA_1_LINE

T0 = datetime(2026, 1, 1, tzinfo=UTC)
GPU = Partition("gpu", 2 * 86400.0, False, "2-00:00:00")
QWEN = 'description = "qwen"\n'  # an arm of defaults


def make_record(
    item: int,
    duration_s: float,
    *,
    stratum: str = "long",
    verdict: Verdict = Verdict.COMPLETED,
    start_s: float | None = None,
    attempt: int = 1,
) -> LedgerRecord:
    """A record shaped like the runner's (three turns, Slurm info); started `start_s`
    seconds into the campaign (default: the item's number), finished `duration_s` later."""
    started = T0 + timedelta(seconds=item if start_s is None else start_s)
    turn = TurnRecord(index=0, thread_id="t", latency_s=1.5, steps=3, tokens_in=900)
    return LedgerRecord(
        run_id="7_0.1",
        campaign="camp",
        arm="qwen",
        stratum=stratum,
        item_id=f"{item:064x}",
        nodeid=f'experiments/test_c.py::test_conversation[qwen-s{item}-r0 "q"]',
        script=f"s{item}",
        script_sha256="0" * 64,
        repeat=0,
        attempt=attempt,
        outcome=verdict.outcome,
        verdict=verdict,
        started_at=started.isoformat(timespec="microseconds"),
        finished_at=(started + timedelta(seconds=min(duration_s, 1e6))).isoformat(
            timespec="microseconds"
        ),
        duration_s=duration_s,
        model_identity={"kind": "unknown", "text": "m"},
        backend_identity={"kind": "unknown", "text": "b"},
        tags=("smoke",),
        settings={"generation": {"max_tokens": 512, "temperature": 0.0}},
        turns=(turn, turn, turn),
        error=None if verdict is Verdict.COMPLETED else ErrorInfo(kind="x", message="y"),
        slurm=SlurmInfo(
            job_id="7", array_job_id="7", array_task_id="0", node="n1", restart_count=0
        ),
        harness_version="0.1.0",
    )


def write_ledger(
    campaign: Path, records: list[LedgerRecord], *, arm: str = "qwen", run_id: str = "7_0.1"
) -> Path:
    path = campaign / arm / "ledger" / f"{run_id}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "ab") as handle:
        for record in records:
            handle.write(record_line(record))
    return path


def write_experiments(
    root: Path, arms: dict[str, str], strata: dict[str, int], *, campaign: Path | None = None
) -> Path:
    """One script per stratum, of that many repeats. With `campaign`, its ledgers' items
    `make_record(i, stratum=...)` become repeat i of the stratum's script: current items
    (records past the repeats keep their ids, and are stale)."""
    _write_experiments(root, arms, strata)
    if campaign is not None:
        specs = submitted_item_specs(load_experiments(root), Profile.LOCAL, site_image=None)
        for arm in arms:
            current = {
                (spec.stratum, spec.repeat): spec.item_id for spec in specs if spec.arm.name == arm
            }
            for ledger in (campaign / arm / "ledger").glob("*.jsonl"):
                lines = ledger.read_bytes().splitlines(keepends=True)
                ledger.write_bytes(b"".join(_identified(line, current) for line in lines))
    return root


def _identified(line: bytes, current: dict[tuple[str, int], str]) -> bytes:
    record = json.loads(line)
    new = current.get((record["stratum"], int(record["item_id"], 16)))
    return line if new is None else line.replace(record["item_id"].encode(), new.encode())


def _write_experiments(root: Path, arms: dict[str, str], strata: dict[str, int]) -> None:
    (root / "arms").mkdir(parents=True)
    (root / "scripts").mkdir()
    for name, toml in arms.items():
        (root / "arms" / f"{name}.toml").write_text(toml)
    scripts = [
        json.dumps(
            {
                "id": f"{stratum}-s",
                "stratum": stratum,
                "repeats": repeats,
                "turns": [{"user": f"hi {stratum}"}],
            }
        )
        for stratum, repeats in strata.items()
    ]
    (root / "scripts" / "all.jsonl").write_text("\n".join(scripts) + "\n")


def measured(durations: list[float]) -> StratumCost:
    """Arm qwen, stratum long: items started in this order, each done."""
    times = [(f"{i:06d}".encode(), duration) for i, duration in enumerate(durations)]
    return StratumCost.from_times("qwen", "long", times, len(durations))


def no_warnings(message: str) -> None:
    raise AssertionError(f"unexpected warning: {message}")


# -- Measured figures ----------------------------------------------------------------------


def test_median_p95_and_max_come_from_measured_attempts_only(tmp_path: Path) -> None:
    campaign = tmp_path / "camp"
    records = [make_record(i, float(i)) for i in range(1, 21)]  # 1..20 s
    records += [
        make_record(100, 5000.0, verdict=Verdict.INFRA_ERROR),  # cut short or stretched
        make_record(101, 5000.0, verdict=Verdict.INTERRUPTED),
        make_record(102, 5000.0, verdict=Verdict.SUBSTITUTED),
        make_record(103, math.inf),  # written as null: no finite duration
    ]
    write_ledger(campaign, records)

    costs = load_costs(campaign, warn=no_warnings)

    long = costs["qwen", "long"]
    assert (long.n, long.median_s, long.p95_s, long.max_s) == (20, 10.5, 19.0, 20.0)
    assert long.mean_s == 10.5
    # Done: the 20 measured, substituted and the null-duration completed; not the retried.
    assert long.done == 22


def test_done_counts_distinct_items_by_their_newest_record(tmp_path: Path) -> None:
    campaign = tmp_path / "camp"
    write_ledger(
        campaign,
        [
            make_record(1, 10.0, verdict=Verdict.INFRA_ERROR, start_s=0),
            make_record(2, 10.0, start_s=0),
        ],
        run_id="7_0.1",
    )
    write_ledger(
        campaign,
        [
            make_record(1, 12.0, start_s=100, attempt=2),  # retried and done
            make_record(2, 11.0, verdict=Verdict.INTERRUPTED, start_s=100, attempt=2),
        ],
        run_id="8_0.1",
    )

    long = load_costs(campaign, warn=no_warnings)["qwen", "long"]

    # Measured: the two completed attempts; done: item 1 (item 2's newest was interrupted).
    assert (long.n, long.done) == (2, 1)


def test_late_items_costing_more_give_the_trend_factor(tmp_path: Path) -> None:
    campaign = tmp_path / "camp"
    by_start = [10.0, 10.0, 10.0, 12.0, 12.0, 12.0, 13.0, 13.0, 13.0]
    records = [make_record(i, d, start_s=60 * i) for i, d in enumerate(by_start)]
    # Written out of start order, over two runs: the trend follows started_at.
    write_ledger(campaign, records[4:], run_id="7_0.1")
    write_ledger(campaign, records[:4], run_id="9_0.1")

    long = load_costs(campaign, warn=no_warnings)["qwen", "long"]

    assert (long.early_mean_s, long.late_mean_s) == (10.0, 13.0)
    assert long.trend == pytest.approx(1.3)
    assert long.per_item_s == 13.0  # the late mean, above the overall mean of 11.67


def test_the_report_warns_of_a_rising_cost_and_projects_at_the_late_mean(tmp_path: Path) -> None:
    campaign = tmp_path / "camp"
    by_start = [10.0, 10.0, 10.0, 12.0, 12.0, 12.0, 13.0, 13.0, 13.0]
    write_ledger(campaign, [make_record(i, d) for i, d in enumerate(by_start)])
    experiments = write_experiments(
        tmp_path / "exp", {"qwen": QWEN}, {"long": 109}, campaign=campaign
    )

    lines = cost_lines(
        campaign, experiments, concurrency=1, margin=1.5, partitions=[GPU], warn=no_warnings
    )

    # 100 remaining x 13.0 s = 1300 s of work; x1.5 + 480 s = 2430 s -> the 1 h bucket.
    assert lines[2:] == [
        "arm qwen, stratum long: 21.7 min/task on the default partition (cap unknown), from 9 "
        "items: ask --array=0-0 --time=01:00:00",
        "  median 12.0 s/item, p95 13.0 s/item, max 13.0 s/item, mean 11.7 s/item, "
        "late/early 1.30x",
        "  note: sinfo marks no default partition: no cap applied",
        "  warning: cost rises with item order (late/early 1.30x > 1.2x): projected at the "
        "late-third mean 13.0 s/item",
        "  remaining 100 of 109 items (9 done): 100 x 13.0 s/item / concurrency 1 = 21.7 min "
        "of work; 1 task of 100 items: 21.7 min x1.5 margin + 480 s = 40.5 min/task",
    ]


def test_too_few_items_say_so_instead_of_a_plan(tmp_path: Path) -> None:
    campaign = tmp_path / "camp"
    write_ledger(campaign, [make_record(i, 30.0) for i in range(3)])
    experiments = write_experiments(
        tmp_path / "exp", {"qwen": QWEN}, {"long": 10, "short": 4}, campaign=campaign
    )

    lines = cost_lines(
        campaign, experiments, concurrency=None, margin=1.5, partitions=[GPU], warn=no_warnings
    )

    # The few measured items give the full stage's walltime, for the user to choose; none
    # measured, the smoke stage measures some. Each command is one haico parses.
    full = f"haico submit {campaign} --stage full --arm qwen --stratum long"
    assert lines[2:] == [
        "arm qwen, stratum long: too few items to project: 3 measured, need 5; to submit on "
        f"these 3 items alone: {full} --time 00:15:00 --tasks 1",
        "  median 30.0 s/item, p95 30.0 s/item, max 30.0 s/item, mean 30.0 s/item, "
        "late/early 1.00x",
        "  remaining 7 of 10 items (3 done)",
        "arm qwen, stratum short: too few items to project: 0 measured, need 5; measure some "
        f"first: haico submit {campaign} --stage smoke --arm qwen --stratum short",
        "  remaining 4 of 4 items (0 done)",
    ]
    full_args, smoke_args = (
        _parser().parse_args(shlex.split(line.partition(": haico ")[2]))
        for line in (lines[2], lines[5])
    )
    for args in full_args, smoke_args:
        assert (args.run, Path(args.campaign), args.arm) == (run_submit, campaign, ["qwen"])
    assert (full_args.stage, full_args.stratum, full_args.time, full_args.tasks) == (
        "full",
        ["long"],
        "00:15:00",
        1,
    )
    assert (smoke_args.stage, smoke_args.stratum, smoke_args.time) == ("smoke", ["short"], None)
    with pytest.raises(ValueError, match="too few"):
        plan_array(measured([30.0] * (MIN_ITEMS - 1)), 7, concurrency=1, partition=GPU)


# -- The plan ------------------------------------------------------------------------------


def test_the_walltime_rounds_up_into_the_partition_ladder() -> None:
    sixty = measured([60.0] * 10)

    # 100 items x 60 s / 4 = 1500 s; x1.5 + 480 s = 2730 s -> the 1 h rung.
    plan = plan_array(sixty, 100, concurrency=4, partition=GPU)

    assert (plan.tasks, plan.items_per_task, plan.per_task_work_s) == (1, 100, 1500.0)
    assert (plan.walltime_s, plan.time_s, plan.time_limit) == (2730.0, 3600.0, "01:00:00")
    assert not plan.margin_trimmed
    # Without a partition (sinfo unavailable), the same ladder. 80 items: 1200 s x1.5 +
    # 480 s = 2280 s -> 1 h; with --margin 1, 1680 s -> 30 min.
    assert plan_array(sixty, 80, concurrency=4, partition=None).time_limit == "01:00:00"
    unpadded = plan_array(sixty, 80, concurrency=4, partition=None, margin=1)
    assert (unpadded.walltime_s, unpadded.time_limit) == (1680.0, "00:30:00")


def test_the_cap_itself_is_a_bucket() -> None:
    fifty = Partition("short", 50 * 60.0, True, "50:00")
    # 100 x 60 s / 4 = 1500 s; x1.5 + 480 s = 2730 s: above 30 min, within the 50 min cap.
    plan = plan_array(measured([60.0] * 10), 100, concurrency=4, partition=fifty)

    assert (plan.tasks, plan.time_limit) == (1, "00:50:00")


def test_work_beyond_the_cap_goes_to_more_tasks() -> None:
    short = Partition("short", 45 * 60.0, True, "45:00")
    # 2730 s does not fit 45 min: a task may take 2220 s / 1.5 x 4 / 60 s = 98 items.
    plan = plan_array(measured([60.0] * 10), 100, concurrency=4, partition=short)

    assert (plan.tasks, plan.items_per_task, plan.per_task_work_s) == (2, 50, 750.0)
    assert (plan.walltime_s, plan.time_limit) == (1605.0, "00:30:00")


def test_without_a_cap_work_beyond_a_week_is_split_too() -> None:
    # 10,000 x 600 s = 69.4 days of work at concurrency 1.
    plan = plan_array(measured([600.0] * 10), 10_000, concurrency=1, partition=None)

    week = 7 * 86400.0
    assert plan.tasks == math.ceil(10_000 / math.floor((week - 480) / 1.5 / 600))
    assert plan.time_limit == "7-00:00:00"


def test_a_task_never_gets_less_than_the_longest_item() -> None:
    slow_tail = measured([10.0] * 9 + [900.0])

    plan = plan_array(slow_tail, 2, concurrency=8, partition=GPU)

    # 2 x 99 s / 8 = 24.75 s, below the longest item: 900 s x1.5 + 480 s = 30 min.
    assert (plan.per_task_work_s, plan.walltime_s, plan.time_limit) == (900.0, 1830.0, "01:00:00")


def test_a_margin_that_does_not_fit_the_cap_is_trimmed_never_the_measured_work() -> None:
    short = Partition("short", 45 * 60.0, True, "45:00")
    # The longest item, 2000 s, fits the 2220 s the cap leaves; x1.5 it does not.
    plan = plan_array(measured([2000.0] * 5), 1, concurrency=1, partition=short)

    assert plan.margin_trimmed
    assert (plan.per_task_work_s, plan.walltime_s, plan.time_limit) == (2000.0, 2700.0, "00:45:00")


def test_an_item_longer_than_the_cap_is_an_error() -> None:
    short = Partition("short", 45 * 60.0, True, "45:00")

    with pytest.raises(ItemLongerThanCapError) as raised:
        plan_array(measured([60.0] * 5 + [2300.0]), 10, concurrency=1, partition=short)

    assert str(raised.value) == (
        "arm qwen, stratum long: an item took 2300.0 s, longer than the 2220 s that "
        "partition short's cap 00:45:00 leaves after 480 s of stack start-up, signal lead, "
        "early signal and shutdown: choose a partition with a longer cap ([slurm] partition in "
        "arms/qwen.toml) or split the stratum's longest scripts"
    )


def test_the_report_plans_on_the_arms_partition_at_its_concurrency(tmp_path: Path) -> None:
    campaign = tmp_path / "camp"
    write_ledger(campaign, [make_record(i, 60.0, stratum="short") for i in range(10)])
    arm = '[run]\nconcurrency = 4\n[slurm]\npartition = "short"\ntime = "00:20:00"\n'
    experiments = write_experiments(
        tmp_path / "exp", {"qwen": arm}, {"short": 110}, campaign=campaign
    )
    partitions = parse_sinfo("debug* 1:00:00\nshort 45:00\n")

    lines = cost_lines(
        campaign,
        experiments,
        concurrency=None,
        margin=1.5,
        partitions=partitions,
        warn=no_warnings,
    )

    assert lines[2:] == [
        "arm qwen, stratum short: 12.5 min/task on partition short (cap 00:45:00), from 10 "
        "items: ask --array=0-1 --time=00:30:00",
        "  median 60.0 s/item, p95 60.0 s/item, max 60.0 s/item, mean 60.0 s/item, "
        "late/early 1.00x",
        "  remaining 100 of 110 items (10 done): 100 x 60.0 s/item / concurrency 4 = 25.0 min "
        "of work; 2 tasks of <= 50 items: 12.5 min x1.5 margin + 480 s = 26.8 min/task",
        "  warning: [slurm] time = 00:20:00 in arms/qwen.toml is below the 26.8 min a task "
        "needs: its last items would be cut at the walltime",
    ]
    # --concurrency overrides the arm's: 100 x 60 s / 8 = 750 s fits one task.
    overridden = cost_lines(
        campaign,
        experiments,
        concurrency=8,
        margin=1.5,
        partitions=partitions,
        warn=no_warnings,
    )
    assert overridden[2].endswith("ask --array=0-0 --time=00:30:00")


def test_an_auto_arm_is_planned_at_its_max_concurrency(tmp_path: Path) -> None:
    campaign = tmp_path / "camp"
    write_ledger(campaign, [make_record(i, 60.0, stratum="short") for i in range(10)])
    arm = '[run]\nconcurrency = "auto"\nmax_concurrency = 4\n[slurm]\npartition = "short"\n'
    experiments = write_experiments(
        tmp_path / "exp", {"qwen": arm}, {"short": 110}, campaign=campaign
    )
    partitions = parse_sinfo("debug* 1:00:00\nshort 45:00\n")
    lines = cost_lines(
        campaign, experiments, concurrency=None, margin=1.5, partitions=partitions, warn=no_warnings
    )
    assert "100 x 60.0 s/item / concurrency 4 = 25.0 min of work" in lines[4]


def test_the_report_says_when_sinfo_was_unavailable(tmp_path: Path) -> None:
    campaign = tmp_path / "camp"
    write_ledger(campaign, [make_record(i, 60.0) for i in range(10)])
    experiments = write_experiments(
        tmp_path / "exp", {"qwen": QWEN}, {"long": 10}, campaign=campaign
    )

    lines = cost_lines(
        campaign, experiments, concurrency=None, margin=2, partitions=None, warn=no_warnings
    )

    assert lines == [
        f"campaign {campaign}: remaining items from {experiments} (the local profile's item "
        "ids: records of scripts or arms edited since are stale, not counted)",
        "--time = measured work per task x2 (--margin) + the arm's measured stack start-up + "
        "300 s signal lead + 60 s early signal + 120 s dump and shutdown, rounded up to a "
        "bucket of the partition",
        "sinfo unavailable: partition caps unknown, planned without a cap",
        "arm qwen, stratum long: all 10 items done, from 10 items: nothing to submit",
        "  median 60.0 s/item, p95 60.0 s/item, max 60.0 s/item, mean 60.0 s/item, "
        "late/early 1.00x",
    ]


def test_the_report_names_what_it_cannot_plan_with(tmp_path: Path) -> None:
    campaign = tmp_path / "camp"
    write_ledger(campaign, [make_record(i, 2000.0) for i in range(5)])
    write_ledger(campaign, [make_record(i, 60.0) for i in range(5)], arm="gone")
    arms = {
        "qwen": '[slurm]\npartition = "short"\n',
        "llama": '[slurm]\npartition = "huge"\n',
    }
    experiments = write_experiments(tmp_path / "exp", arms, {"long": 6}, campaign=campaign)
    partitions = parse_sinfo("short* 45:00\n")

    lines = cost_lines(
        campaign,
        experiments,
        concurrency=None,
        margin=1.5,
        partitions=partitions,
        warn=no_warnings,
    )

    assert lines[2:] == [
        "arm gone, stratum long: 60.0 s/item from 5 items, 5 done; remaining unknown "
        f"(no arms/gone.toml in {experiments})",
        "  median 60.0 s/item, p95 60.0 s/item, max 60.0 s/item, mean 60.0 s/item, "
        "late/early 1.00x",
        "arm llama, stratum long: too few items to project: 0 measured, need 5; measure some "
        f"first: haico submit {campaign} --stage smoke --arm llama --stratum long",
        "  remaining 6 of 6 items (0 done)",
        "arm qwen, stratum long: 33.3 min/task on partition short (cap 00:45:00), from 5 "
        "items: ask --array=0-0 --time=00:45:00",
        "  median 2000.0 s/item, p95 2000.0 s/item, max 2000.0 s/item, mean 2000.0 s/item, "
        "late/early 1.00x",
        "  remaining 1 of 6 items (5 done): 1 x 2000.0 s/item / concurrency 8 = 4.2 min of "
        "work; 1 task of 1 item: 33.3 min cap (margin trimmed to fit) + 480 s = "
        "45.0 min/task",
    ]


def test_a_time_limit_slurm_cannot_read_is_refused_naming_the_arm_file_field_and_formats(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("pytest_haico.slurm.timelimits.read_partitions", lambda: [GPU])
    campaign = tmp_path / "camp"
    write_ledger(campaign, [make_record(i, 2000.0) for i in range(5)])
    arms = {"qwen": '[slurm]\npartition = "short"\ntime_per_stratum = {long = "1h"}\n'}
    experiments = write_experiments(tmp_path / "exp", arms, {"long": 6})
    refusal = (
        f"{experiments / 'arms' / 'qwen.toml'}: slurm.time_per_stratum.long: not a Slurm "
        "time limit: use MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS or 'infinite', got '1h'"
    )

    with pytest.raises(ConfigError) as raised:
        cost_lines(
            campaign, experiments, concurrency=None, margin=1.5, partitions=[GPU], warn=no_warnings
        )
    assert str(raised.value) == refusal

    # `haico cost` says so in one line, before planning anything, and exits 2.
    assert main(["cost", str(campaign), "--experiments", str(experiments)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(f"haico: {refusal}")
    assert "Traceback" not in captured.err


def test_an_arm_on_a_partition_sinfo_does_not_list_is_planned_without_a_cap(
    tmp_path: Path,
) -> None:
    campaign = tmp_path / "camp"
    write_ledger(campaign, [make_record(i, 60.0) for i in range(5)])
    experiments = write_experiments(
        tmp_path / "exp", {"qwen": '[slurm]\npartition = "huge"\n'}, {"long": 10}, campaign=campaign
    )

    listed = cost_lines(
        campaign, experiments, concurrency=None, margin=1.5, partitions=[GPU], warn=no_warnings
    )
    unlisted = cost_lines(
        campaign, experiments, concurrency=None, margin=1.5, partitions=None, warn=no_warnings
    )

    assert listed[2].startswith("arm qwen, stratum long: 60.0 s/task on the default partition")
    assert listed[4] == (
        "  note: partition 'huge' ([slurm] partition in arms/qwen.toml) is not in sinfo's "
        "list: no cap applied"
    )
    assert unlisted[3].startswith(
        "arm qwen, stratum long: 60.0 s/task on partition huge (cap unknown), from 5 items"
    )


def test_without_experiments_the_report_has_figures_but_no_plan(tmp_path: Path) -> None:
    campaign = tmp_path / "camp"
    write_ledger(campaign, [make_record(i, 60.0) for i in range(10)])

    lines = cost_lines(
        campaign, None, concurrency=None, margin=1.5, partitions=[GPU], warn=no_warnings
    )

    assert (
        lines[0]
        == f"campaign {campaign}: no --experiments: remaining items unknown, no array plans"
    )
    assert lines[2] == (
        "arm qwen, stratum long: 60.0 s/item from 10 items, 10 done; remaining unknown "
        "(no --experiments)"
    )


# -- Slurm time limits and partitions ------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90", 5400.0),
        ("5:30", 330.0),
        ("1:00:00", 3600.0),
        ("2-12", 2 * 86400 + 12 * 3600.0),
        ("2-12:30", 2 * 86400 + 12 * 3600 + 30 * 60.0),
        ("2-12:30:15", 2 * 86400 + 12 * 3600 + 30 * 60 + 15.0),
        (" 30:00\n", 1800.0),
        ("infinite", None),
        ("UNLIMITED", None),
        ("0", None),  # Slurm reads a zero limit as none
    ],
)
def test_slurm_time_limits_parse_to_seconds(text: str, seconds: float | None) -> None:
    assert parse_time_limit(text) == seconds


@pytest.mark.parametrize("text", ["", "n/a", "1:2:3:4", "1-", "-5", "1.5", "1-2-3", "1h"])
def test_a_malformed_time_limit_is_an_error_naming_it(text: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_time_limit(text, where="--time")

    assert str(raised.value) == (
        f"--time: {text!r} is not a Slurm time limit: use MM, MM:SS, HH:MM:SS, D-HH, "
        "D-HH:MM, D-HH:MM:SS or 'infinite'"
    )


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.5, "00:01:00"),
        (59.0, "00:01:00"),
        (3600.0, "01:00:00"),
        (3600.5, "01:01:00"),
        (7200.000000001, "02:00:00"),
        (86400.0, "1-00:00:00"),
        (90061.0, "1-01:02:00"),
        (7 * 86400.0, "7-00:00:00"),
    ],
)
def test_time_limits_format_in_whole_minutes_rounded_up(seconds: float, text: str) -> None:
    assert format_time_limit(seconds) == text
    assert parse_time_limit(text) == math.ceil(seconds / 60 - 1e-9) * 60
    assert format_time_limit(parse_time_limit(text) or 0) == text


def test_sinfo_partitions_with_the_default_and_no_cap() -> None:
    text = "debug* 1:00:00\ngpu 2-00:00:00\nshort 30:00\nlong infinite\nodd n/a\n\ngpu 1:00\n"

    partitions = parse_sinfo(text)

    assert partitions == [
        Partition("debug", 3600.0, True, "1:00:00"),
        Partition("gpu", 172800.0, False, "2-00:00:00"),
        Partition("short", 1800.0, False, "30:00"),
        Partition("long", None, False, "infinite"),
        Partition("odd", None, False, "n/a"),
    ]
    assert [p.cap_text for p in partitions] == [
        "cap 01:00:00",
        "cap 2-00:00:00",
        "cap 00:30:00",
        "no cap",
        "cap unknown: sinfo printed 'n/a', planned without a cap",
    ]


def test_a_partitions_gpus_per_node_are_its_largest_nodes() -> None:
    text = "gpu* 8:00:00 gpu:a100:4(S:0,1)\ngpu 8:00:00 gpu:h100:8,shard:8\ncpu 1:00 (null)\n"

    assert [(p.name, p.gpus_per_node) for p in parse_sinfo(text)] == [("gpu", 8), ("cpu", 0)]


def test_partitions_are_read_from_sinfo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sinfo = tmp_path / "sinfo"
    sinfo.write_text(
        '#!/bin/sh\n[ "$*" = "-h -o %P %l %G" ] || exit 3\necho "gpu* 8:00:00 gpu:h100:4"\n'
    )
    sinfo.chmod(sinfo.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")

    assert read_partitions() == [Partition("gpu", 8 * 3600.0, True, "8:00:00", 4)]


# -- The ledgers ---------------------------------------------------------------------------


def test_torn_and_garbage_lines_are_warned_and_skipped(tmp_path: Path) -> None:
    campaign = tmp_path / "camp"
    path = write_ledger(campaign, [make_record(i, 10.0) for i in range(4)])
    spaced = make_record(4, 20.0).model_dump(mode="json", by_alias=True)
    with open(path, "ab") as handle:
        handle.write(b"not json\n")
        handle.write(json.dumps(spaced).encode() + b"\n")  # another shape: the full parse
        handle.write(b'{"schema": 3, "stratum": "long"}\n')
        handle.write(b'{"schema": 1, "stratum": "long"}\n')
        handle.write(record_line(make_record(5, 30.0))[:80])  # a kill mid-write
    warnings: list[str] = []

    long = load_costs(campaign, warn=warnings.append)["qwen", "long"]

    assert (long.n, long.max_s, long.done) == (5, 20.0, 5)
    assert warnings == [
        f"{path}:5: skipped not valid JSON",
        f"{path}:7: skipped a record of schema 3, newer than this pytest-haico reads (2); "
        "upgrade pytest-haico",
        f"{path}:8: skipped a record without a valid stratum, item_id, verdict or times",
        f"{path}:9: skipped a torn last line (a kill mid-write?)",
    ]


def test_lines_as_the_plugin_writes_them_take_the_fast_path() -> None:
    line = record_line(make_record(1, 12.5, verdict=Verdict.RECURSION_LIMIT))

    match = item_costs._COST_FIELDS.match(line)

    assert match is not None
    assert match.group(1, 4, 7) == (b"long", b"recursion_limit", b"12.5")


def test_a_schema_1_line_takes_the_fast_path_and_a_future_schema_does_not(
    tmp_path: Path,
) -> None:
    future = SCHEMA_1_LINE.replace(b'{"schema":1,', b'{"schema":3,')
    assert item_costs._COST_FIELDS.match(SCHEMA_1_LINE) is not None
    assert item_costs._COST_FIELDS.match(future) is None
    path = write_ledger(tmp_path, [make_record(1, 12.5, stratum="default")], arm="demo")
    with open(path, "ab") as handle:
        handle.write(SCHEMA_1_LINE + future)
    warnings: list[str] = []

    cost = load_costs(tmp_path, warn=warnings.append)["demo", "default"]

    assert (cost.n, cost.done, cost.max_s) == (2, 2, 12.5)
    assert warnings == [
        f"{path}:3: skipped a record of schema 3, newer than this pytest-haico reads (2); "
        "upgrade pytest-haico"
    ]


def test_the_fast_path_and_the_full_parse_agree(tmp_path: Path) -> None:
    records = [make_record(i, 5.0 + i % 7, stratum=f"s{i % 2}") for i in range(30)]
    records += [make_record(i, 1.0, verdict=Verdict.INFRA_ERROR) for i in range(30, 40)]
    write_ledger(tmp_path / "fast", records)
    spaced = tmp_path / "full" / "qwen" / "ledger" / "7_0.1.jsonl"
    spaced.parent.mkdir(parents=True)
    spaced.write_text(
        "".join(json.dumps(r.model_dump(mode="json", by_alias=True)) + "\n" for r in records)
    )

    assert load_costs(tmp_path / "fast", warn=no_warnings) == load_costs(
        tmp_path / "full", warn=no_warnings
    )


def test_a_missing_campaign_directory_is_an_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(CostError) as raised:
        load_costs(tmp_path / "nope", warn=no_warnings)

    assert str(raised.value) == (
        f"the campaign directory {tmp_path / 'nope'} does not exist: give "
        "<results>/<campaign>, the directory holding one <arm>/ledger/ per arm"
    )


def test_a_campaign_without_ledgers_is_an_error_saying_what_to_do(tmp_path: Path) -> None:
    campaign = tmp_path / "camp"
    (campaign / "submissions" / "ledger").mkdir(parents=True)
    (campaign / "submissions" / "ledger" / "x.jsonl").write_bytes(record_line(make_record(1, 1.0)))
    (campaign / "qwen" / "runs").mkdir(parents=True)

    with pytest.raises(CostError) as raised:
        cost_lines(campaign, None, concurrency=None, margin=1.5, partitions=None, warn=no_warnings)

    assert str(raised.value) == (
        f"no ledgers yet under {campaign} (<arm>/ledger/*.jsonl): run the smoke stage first "
        "(haico submit <campaign> --stage smoke), then ask again"
    )


@pytest.mark.parametrize(
    ("concurrency", "margin", "refused"),
    [
        (None, 0.5, "--margin: must be at least 1 (no margin), got 0.5"),
        (None, math.nan, "--margin: must be at least 1 (no margin), got nan"),
        (0, 1.5, "--concurrency: must be at least 1, got 0"),
    ],
)
def test_a_margin_or_concurrency_below_one_is_refused(
    tmp_path: Path, concurrency: int | None, margin: float, refused: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        cost_lines(
            tmp_path,
            None,
            concurrency=concurrency,
            margin=margin,
            partitions=None,
            warn=no_warnings,
        )

    assert str(raised.value) == refused


def test_a_ledger_that_is_not_a_file_is_an_error_naming_it(tmp_path: Path) -> None:
    campaign = tmp_path / "camp"
    write_ledger(campaign, [make_record(1, 1.0)])
    (campaign / "qwen" / "ledger" / "8_0.1.jsonl").mkdir()

    with pytest.raises(ResultsError, match=r"8_0\.1\.jsonl: it is a directory, not a regular"):
        load_costs(campaign, warn=no_warnings)


def test_the_stack_start_up_of_the_arms_runs_is_measured_and_added_to_the_walltime(
    tmp_path: Path,
) -> None:
    campaign = tmp_path / "camp"
    records = [make_record(i, 60.0, stratum="short") for i in range(10)]
    write_ledger(campaign, records)
    [ledger] = (campaign / "qwen" / "ledger").glob("*.jsonl")
    first_start = min(datetime.fromisoformat(r.started_at).timestamp() for r in records)
    # The run claimed its directory 95 s before its first item started (stack + gates).
    claim = campaign / "qwen" / "runs" / ledger.stem / "claim.json"
    claim.parent.mkdir(parents=True)
    claim.write_text(json.dumps({"run_id": ledger.stem, "claimed_at": first_start - 95.0}))

    [cost] = load_costs(campaign, warn=pytest.fail).values()
    assert cost.startup_s == pytest.approx(95.0)
    without = plan_array(
        replace(cost, startup_s=None), 10, concurrency=10, partition=None, margin=1.0
    )
    plan = plan_array(cost, 10, concurrency=10, partition=None, margin=1.0)
    assert plan.walltime_s == pytest.approx(without.walltime_s + 95.0)
