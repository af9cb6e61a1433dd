"""`haico submit`: staged, journaled sbatch arrays over a submission's frozen inputs, one
array per arm × stratum.

smoke: a 2-task array per arm × stratum with --haico-limit-per-stratum, to measure the
stack and the item costs. full: every item, with the walltime and array size `haico cost`
derives from what was measured, after the smoke jobs of its arm ended OK (`haico
continue` runs again what they leave unfinished).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from pytest_haico.config.concurrency import resolve_concurrency
from pytest_haico.config.experiment import Arm, Experiments, load_experiments
from pytest_haico.files import DEFAULT_FILE_MODE, make_dirs, shown_path, write_atomic
from pytest_haico.report.cost import MIN_ITEMS, plan_array
from pytest_haico.report.item_costs import StratumCost, current_items
from pytest_haico.slurm.timelimits import Partition, resolve_partition
from pytest_haico.submit.inputs import (
    InputsError,
    Sources,
    Submission,
    freeze,
    planned_submission,
    submission_lock,
    submissions_dir,
)
from pytest_haico.submit.jobs import (
    Request,
    Say,
    SubmitError,
    check_gpus_on_one_node,
    checked_time,
    job_name,
    measured_costs,
    partition_caps,
    pytest_args,
)
from pytest_haico.submit.journal import Journal, JournaledJob, PlannedJob, now_iso
from pytest_haico.submit.reconcile import Reconciler, refresh_ends
from pytest_haico.submit.shares import item_specs
from pytest_haico.submit.submitting import run_jobs, show

SMOKE_TASKS = 2


def submit(
    campaign_dir: Path, sources: Sources, stage: str, request: Request, *, profile: str, say: Say
) -> int:
    """Submit one stage of the campaign from `sources`; 0 when every job is in Slurm. All
    but a dry run hold the submission's lock throughout."""
    if request.dry_run:
        return _dry_run(campaign_dir, sources, stage, request, profile=profile, say=say)
    name = planned_submission(campaign_dir, sources, profile).name
    try:
        make_dirs(submissions_dir(campaign_dir), DEFAULT_FILE_MODE)
    except OSError as exc:
        raise InputsError(
            f"cannot make {submissions_dir(campaign_dir)}: {exc.strerror or exc}"
        ) from exc
    with submission_lock(campaign_dir, name, command=f"submit --stage {stage}", say=say):
        # Read again under the lock: another command may have frozen it meanwhile.
        submission = planned_submission(campaign_dir, sources, profile)
        existed = submission.dir.is_dir()
        journal = Journal(submission.journal)
        jobs = journal.read(warn=say) if existed else {}
        _check_smoked(submission, stage, jobs)
        experiments = load_experiments(sources.experiments)
        plans = _plan_stage(submission, experiments, stage, request, jobs, say=say)
        if not existed:
            submission = freeze(submission, sources, created=now_iso())
            say(f"haico: froze the inputs ({submission.digest}) in {shown_path(submission.dir)}")
        if stage == "smoke" and not submission.checklist.exists():
            _write_checklist(submission, plans)
            say(f"haico: stage-2 checklist written to {shown_path(submission.checklist)}")
        reconciler = Reconciler(
            submission, journal, request, say=say, journal_lost=existed and not jobs
        )
        reconciler.settle(jobs)
        refresh_ends(jobs, journal)
        run_jobs(submission, experiments, jobs, plans, reconciler, say=say)
    return 0


def _dry_run(
    campaign_dir: Path, sources: Sources, stage: str, request: Request, *, profile: str, say: Say
) -> int:
    """The sbatch command lines the stage would run; nothing written, nothing locked."""
    submission = planned_submission(campaign_dir, sources, profile)
    jobs = Journal(submission.journal).read(warn=say) if submission.dir.is_dir() else {}
    experiments = load_experiments(sources.experiments)
    plans = _plan_stage(submission, experiments, stage, request, jobs, say=say)
    say(
        f"haico: dry run: submission {submission.name} ({submission.digest}) in "
        f"{shown_path(campaign_dir)}"
    )
    if not submission.dir.is_dir():
        say(
            f"haico: would copy {shown_path(sources.experiments)} to "
            f"{shown_path(submission.experiments)}"
        )
    show(plans, jobs, submission, experiments, say)
    return 0


def _check_smoked(submission: Submission, stage: str, jobs: Mapping[str, JournaledJob]) -> None:
    if stage == "full" and not any(j.plan.stage == "smoke" for j in jobs.values()):
        raise SubmitError(
            f"no smoke stage was submitted for these inputs ({submission.digest[:19]}): "
            f"run `haico submit {submission.campaign_dir} --stage smoke` first (if you edited "
            "experiments/ since the smoke stage, that is a new submission)"
        )


def _plan_stage(
    submission: Submission,
    experiments: Experiments,
    stage: str,
    request: Request,
    jobs: Mapping[str, JournaledJob],
    *,
    say: Say,
) -> list[PlannedJob]:
    arms = _selected(experiments.arms, request.arms, "arm", "--arm")
    strata_all = sorted(experiments.strata)
    strata = _selected(dict.fromkeys(strata_all), request.strata, "stratum", "--stratum")
    current = current_items(item_specs(submission, experiments))
    measured = measured_costs(submission.campaign_dir, say, current=current)
    partitions = partition_caps(say)
    planned = _planned_counts(experiments)
    plans: list[PlannedJob] = []
    for arm_name in arms:
        arm = experiments.arms[arm_name]
        if submission.profile == "cluster" and arm.model.served is None:  # it starts vLLM
            check_gpus_on_one_node(arm, resolve_partition(arm, partitions)[0])
        for stratum in strata:
            if not planned.get((arm_name, stratum)):
                continue
            name = job_name(submission, stage, arm_name, stratum)
            if stage == "smoke":
                tasks, time, why = _smoke_size(
                    arm, stratum, measured, partitions, request, planned[(arm_name, stratum)]
                )
                # The limit's items are dealt over the tasks: a task with none is not queued.
                tasks = min(tasks, planned[(arm_name, stratum)], request.limit)
                depends: tuple[str, ...] = ()
                limit: int | None = request.limit
            else:
                remaining = planned[(arm_name, stratum)] - _done(measured, arm_name, stratum)
                tasks, time, why = _full_size(
                    arm, stratum, measured, partitions, request, remaining
                )
                depends = tuple(
                    j.plan.name
                    for j in jobs.values()
                    if j.plan.stage == "smoke" and j.plan.arm == arm_name
                )
                limit = None
            plans.append(
                PlannedJob(
                    name=name,
                    stage=stage,
                    arm=arm_name,
                    stratum=stratum,
                    tasks=tuple(range(tasks)),
                    shard_count=tasks,
                    time_limit=time,
                    pytest_args=pytest_args(submission, arm_name, stratum, limit=limit),
                    depends_on=depends,
                    why=why,
                )
            )
    if not plans:
        raise SubmitError("no item is selected: check --arm and --stratum against experiments/")
    return plans


def _smoke_size(
    arm: Arm,
    stratum: str,
    measured: Mapping[tuple[str, str], StratumCost],
    partitions: list[Partition] | None,
    request: Request,
    planned: int,
) -> tuple[int, str, str]:
    if request.time is not None:
        return SMOKE_TASKS, checked_time(request.time, "--time"), "from --time"
    found = measured.get((arm.name, stratum))
    if found is not None and found.n >= MIN_ITEMS:
        items = min(planned, request.limit)
        plan = plan_array(
            found,
            items,
            concurrency=resolve_concurrency(None, arm.run).maximum,
            partition=resolve_partition(arm, partitions)[0],
            margin=request.margin,
        )
        return SMOKE_TASKS, plan.time_limit, f"measured: {found.n} items"
    return SMOKE_TASKS, *_arm_time(arm, stratum)


def _full_size(
    arm: Arm,
    stratum: str,
    measured: Mapping[tuple[str, str], StratumCost],
    partitions: list[Partition] | None,
    request: Request,
    remaining: int,
) -> tuple[int, str, str]:
    found = measured.get((arm.name, stratum))
    if request.time is None and found is not None and found.n >= MIN_ITEMS:
        plan = plan_array(
            found,
            max(remaining, 1),
            concurrency=resolve_concurrency(None, arm.run).maximum,
            partition=resolve_partition(arm, partitions)[0],
            margin=request.margin,
        )
        tasks = request.tasks or plan.tasks
        return tasks, plan.time_limit, f"haico cost: {found.n} items measured"
    tasks = request.tasks or 1
    if request.time is not None:
        return tasks, checked_time(request.time, "--time"), "from --time"
    time, why = _arm_time(arm, stratum)
    if found is None or found.n < MIN_ITEMS:
        why += "; nothing measured yet"
        why += ": pass --tasks N for more array tasks" if request.tasks is None else ""
    return tasks, time, why


def _arm_time(arm: Arm, stratum: str) -> tuple[str, str]:
    per_stratum = arm.slurm.time_per_stratum.get(stratum) if arm.slurm else None
    if per_stratum:
        return checked_time(per_stratum, f"arms/{arm.name}.toml [slurm] time_per_stratum"), (
            f"arms/{arm.name}.toml [slurm] time_per_stratum.{stratum}"
        )
    if arm.slurm and arm.slurm.time:
        return checked_time(arm.slurm.time, f"arms/{arm.name}.toml [slurm] time"), (
            f"arms/{arm.name}.toml [slurm] time"
        )
    raise SubmitError(
        f"no walltime for arm {arm.name}, stratum {stratum}: nothing measured yet and "
        f"arms/{arm.name}.toml has no [slurm] time; set it there or pass --time HH:MM:SS"
    )


def _selected(
    available: Mapping[str, object], wanted: Sequence[str], noun: str, flag: str
) -> list[str]:
    unknown = [w for w in wanted if w not in available]
    if unknown:
        raise SubmitError(
            f"{flag} {unknown[0]}: no such {noun} in experiments/ "
            f"(there: {', '.join(sorted(available)) or 'none'})"
        )
    return list(wanted) if wanted else sorted(available)


def _planned_counts(experiments: Experiments) -> dict[tuple[str, str], int]:
    counts: dict[tuple[str, str], int] = {}
    for arm in experiments.arms:
        for source in experiments.scripts:
            key = (arm, source.script.stratum)
            counts[key] = counts.get(key, 0) + source.script.repeats
    return counts


def _done(measured: Mapping[tuple[str, str], StratumCost], arm: str, stratum: str) -> int:
    found = measured.get((arm, stratum))
    return found.done if found is not None else 0


def _write_checklist(submission: Submission, plans: Sequence[PlannedJob]) -> None:
    """What must be true of the smoke results before the full stage is worth its allocation."""
    arms = sorted({p.arm for p in plans})
    campaign_dir = submission.campaign_dir
    text = f"""# Before the full stage of submission {submission.name}

Inputs: {submission.digest} (frozen in {submission.dir}).
Smoke jobs: {", ".join(p.name for p in plans)}.

Submit the full stage (`haico submit {campaign_dir} --stage full`) only when all hold:

- [ ] Every smoke share is done: `haico continue {campaign_dir} --dry-run` ends its line
      with `done` (a smoke task that timed out and was continued to COMPLETED counts). A full
      stage submitted at once waits for the newest attempts (afterok); if Slurm cancelled it
      because a smoke task failed, `haico continue` reruns it once the smoke shares are done.
- [ ] Each smoke run's gates.json shows every gate passed
      ({campaign_dir}/<arm>/runs/*/gates.json; arms: {", ".join(arms)}).
- [ ] No smoke item ended infra_error, rate_limited or gave_up: those are the stack's
      failures, not the model's, and a full stage would repeat them at scale.
- [ ] The verdicts are the model's behaviour (recursion_limit for a model that loops is a
      result, not a reason to stop), and the transcripts show real answers.
- [ ] `haico cost {campaign_dir}` measured each stratum, or you chose --time knowingly.
- [ ] The digest above is the experiment you mean: an edit made since is a new submission.
"""
    write_atomic(submission.checklist, text.encode(), mode=DEFAULT_FILE_MODE)
