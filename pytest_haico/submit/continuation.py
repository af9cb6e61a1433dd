"""`haico continue`: run again what a submission's jobs left unfinished — the array tasks
that exited 75, timed out, were preempted or lost their node, and nothing that finished —
either as the same shards or, with --tasks M, as the items they still owe split over M
new tasks (an items file in the submission, one test id per line)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from pytest_haico.config.experiment import Arm, Experiments, load_experiments
from pytest_haico.config.item_list import parse_item_list
from pytest_haico.config.items import ItemSpec, build_item_specs, first_per_stratum, in_shard
from pytest_haico.config.settings import Profile, Shard
from pytest_haico.files import DEFAULT_FILE_MODE, make_dirs, write_atomic
from pytest_haico.ledger.format import iter_ledger_dir
from pytest_haico.ledger.resume import ResumeIndex
from pytest_haico.report.cost import MIN_ITEMS, plan_array
from pytest_haico.report.item_costs import StratumCost
from pytest_haico.slurm.timelimits import Partition, resolve_partition
from pytest_haico.submit.inputs import Submission
from pytest_haico.submit.jobs import (
    CONTINUABLE,
    Request,
    Say,
    SubmitError,
    checked_time,
    job_name,
    limit_of,
    measured_costs,
    partition_caps,
    plan_items_file,
    pytest_args,
    reconcile,
    refresh_ends,
    run_jobs,
    show,
)
from pytest_haico.submit.journal import Journal, JournaledJob, PlannedJob


def continue_(submission: Submission, request: Request, *, say: Say) -> int:
    """Resubmit what the submission's jobs left unfinished; 0 when nothing is owed or every
    continuation is in Slurm."""
    journal = Journal(submission.journal)
    jobs = journal.read(warn=say)
    if not jobs:
        raise SubmitError(f"{submission.journal} names no job: nothing to continue")
    reconcile(jobs, journal, request, say=say)
    refresh_ends(jobs, journal)
    owed = _owed(jobs, say)
    if not owed:
        say("haico: nothing to continue: no job of this submission is owed a rerun")
        return 0
    experiments = load_experiments(submission.experiments)
    rounds = {j.plan.stage for j in jobs.values() if j.plan.stage.startswith("continue-")}
    stage = f"continue-{len(rounds) + 1}"
    measured = measured_costs(submission.campaign_dir, say)
    partitions = partition_caps(say)
    plans: list[PlannedJob] = []
    for (arm_name, stratum), shares in owed.items():
        arm = experiments.arms[arm_name]
        name = job_name(submission, stage, arm_name, stratum)
        continues = {job.plan.name: tuple(tasks) for job, tasks in shares}
        if request.tasks is None:
            # One continuation per earlier job (their shard counts may differ).
            for job, tasks in shares:
                time, why = _continue_time(job, arm, measured, partitions, request, tasks=None)
                suffix = "" if len(shares) == 1 else f"-{job.plan.stage}"
                plans.append(
                    replace(
                        job.plan,
                        name=name + suffix,
                        stage=stage,
                        tasks=tuple(tasks),
                        time_limit=time,
                        depends_on=(),
                        continues={job.plan.name: tuple(tasks)},
                        why=why,
                        argv=(),
                    )
                )
            continue
        items = _owed_items(submission, experiments, arm, stratum, shares)
        if not items:
            say(f"haico: arm {arm_name}, stratum {stratum}: the owed shards have nothing left")
            continue
        task_count = min(request.tasks, len(items))
        items_file = submission.dir / stage / f"{arm_name}.{stratum}.items"
        time, why = _continue_time(
            shares[0][0],
            arm,
            measured,
            partitions,
            request,
            tasks=math.ceil(len(items) / task_count),
        )
        plans.append(
            PlannedJob(
                name=name,
                stage=stage,
                arm=arm_name,
                stratum=stratum,
                tasks=tuple(range(task_count)),
                shard_count=task_count,
                time_limit=time,
                pytest_args=pytest_args(submission, arm_name, stratum, items=items_file),
                continues=continues,
                why=f"{why}; {len(items)} owed items over {task_count} tasks",
            )
        )
        if not request.dry_run:
            _write_items(items_file, items, task_count)
    if not plans:
        say("haico: nothing to continue")
        return 0
    if request.dry_run:
        show(plans, jobs, submission, experiments, say)
        return 0
    return run_jobs(submission, experiments, journal, plans, request, say=say, reconciled=True)


def _owed(
    jobs: Mapping[str, JournaledJob], say: Say
) -> dict[tuple[str, str], list[tuple[JournaledJob, list[int]]]]:
    """Per arm × stratum, the tasks of earlier jobs that ended continuable and that no later
    job continues yet."""
    continued: set[tuple[str, int]] = set()
    for job in jobs.values():
        if job.job_id is None:
            continue  # prepared, never submitted: it continues nothing yet
        for name, tasks in job.plan.continues.items():
            continued.update((name, task) for task in tasks)
    owed: dict[tuple[str, str], list[tuple[JournaledJob, list[int]]]] = {}
    for job in jobs.values():
        if job.job_id is None:
            say(f"haico: {job.plan.name}: never submitted")
            continue
        ends = job.ended or {}
        open_tasks = []
        shown = []
        for task in job.plan.tasks:
            end = ends.get(task) or "unknown to Slurm"
            if not end.startswith(CONTINUABLE):  # running, or ended otherwise
                shown.append(f"task {task} {end}")
            elif (job.plan.name, task) in continued:
                shown.append(f"task {task} {end} (continued)")
            else:
                shown.append(f"task {task} {end} (owed)")
                open_tasks.append(task)
        say(f"haico: {job.plan.name} (job {job.job_id}): {', '.join(shown)}")
        if open_tasks:
            owed.setdefault((job.plan.arm, job.plan.stratum), []).append((job, open_tasks))
    return owed


def _owed_items(
    submission: Submission,
    experiments: Experiments,
    arm: Arm,
    stratum: str,
    shares: Sequence[tuple[JournaledJob, Sequence[int]]],
) -> list[str]:
    """The test ids of the items the shares still owe: in their shard, not yet done."""
    specs = _item_specs(submission, experiments)
    ours = [s for s in specs if s.arm.name == arm.name and s.stratum == stratum]
    index = ResumeIndex()
    ledger_dir = submission.campaign_dir / arm.name / "ledger"
    index.add_all(
        iter_ledger_dir(ledger_dir, warn=lambda _: None, resume_fields=True), warn=lambda _: None
    )
    owed: dict[str, None] = {}
    for job, tasks in shares:
        plan = job.plan
        for task in tasks:
            for spec in _items_of_task(plan, task, ours):
                prior = index.get(spec.item_id)
                if not (prior is not None and prior.done):
                    owed[spec.test_id] = None
    return list(owed)


def _items_of_task(plan: PlannedJob, task: int, specs: list[ItemSpec]) -> list[ItemSpec]:
    """The items of `specs` (one arm × stratum) that task `task` of a job runs, selected
    as the plugin selects them: by position in an items file, else by the item_id's shard
    and then the per-stratum limit."""
    shard = Shard(task, plan.shard_count)
    listed = plan_items_file(plan)
    if listed is not None:
        items = parse_item_list(listed)
        by_id = {s.test_id: s for s in specs}
        return [
            by_id[test_id]
            for position, test_id in enumerate(items.test_ids)
            if items.in_shard(position, shard) and test_id in by_id
        ]
    in_task = [s for s in specs if in_shard(s.item_id, shard)]
    limit = limit_of(plan)
    if limit is None:
        return in_task
    chosen = first_per_stratum(in_task, limit)
    return [s for s in in_task if s.ordinal in chosen]


def _continue_time(
    job: JournaledJob,
    arm: Arm,
    measured: Mapping[tuple[str, str], StratumCost],
    partitions: list[Partition] | None,
    request: Request,
    *,
    tasks: int | None,
) -> tuple[str, str]:
    if request.time is not None:
        return checked_time(request.time, "--time"), "from --time"
    found = measured.get((arm.name, job.plan.stratum))
    if tasks is not None and found is not None and found.n >= MIN_ITEMS:
        plan = plan_array(
            found,
            tasks,
            concurrency=arm.run.concurrency,
            partition=resolve_partition(arm, partitions)[0],
            margin=request.margin,
        )
        return plan.time_limit, f"haico cost: {found.n} items measured"
    return job.plan.time_limit, f"as job {job.plan.name}"


@dataclass(frozen=True)
class _Identity:
    profile: Profile
    model_endpoint: str | None = None
    backend_image: str | None = None
    backend_cmd: str | None = None


def _item_specs(submission: Submission, experiments: Experiments) -> list[ItemSpec]:
    """The submission's items with the ids its jobs give them (no endpoint, image or
    command overrides: haico submit passes none)."""
    site = submission.site()
    return build_item_specs(
        experiments,
        _Identity(Profile(submission.profile)),
        site_image=site.get("BACKEND_IMAGE") if site else None,
        backend_tree=None,
    )


def _write_items(path: Path, items: Sequence[str], tasks: int) -> None:
    """The owed items, one test id per line; task k of the array runs lines k, k+tasks, ..."""
    make_dirs(path.parent, DEFAULT_FILE_MODE)
    lines = [
        f"# {len(items)} items over {tasks} array tasks: task k runs the items at positions "
        f"k, k+{tasks}, k+{2 * tasks}, ... (--haico-shard k/{tasks})",
    ]
    lines += list(items)
    write_atomic(path, ("\n".join(lines) + "\n").encode(), mode=DEFAULT_FILE_MODE)
