"""`haico continue`: one line per share of the newest submission (how its newest attempt
ended, what the ledgers say it owes, and the decision table's verdict), then a rerun of the
shares the table reruns — as the same shards, or with --tasks M as their owed items split
over M new tasks (an items file in the submission, one test id per line)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from pytest_haico.config.concurrency import resolve_concurrency
from pytest_haico.config.experiment import Arm, Experiments, load_experiments
from pytest_haico.files import DEFAULT_FILE_MODE, make_dirs, write_atomic
from pytest_haico.report.cost import MIN_ITEMS, plan_array
from pytest_haico.report.item_costs import StratumCost, current_items
from pytest_haico.slurm.client import SlurmError
from pytest_haico.slurm.jobs import cancel
from pytest_haico.slurm.nodes import read_partition_nodes
from pytest_haico.slurm.timelimits import Partition, resolve_partition
from pytest_haico.submit.decisions import Action, Decision, Rules, decide
from pytest_haico.submit.inputs import Submission, submission_lock
from pytest_haico.submit.jobs import (
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
)
from pytest_haico.submit.journal import Journal, JournaledJob, PlannedJob
from pytest_haico.submit.nodes import Exclusions, blame
from pytest_haico.submit.reconcile import Reconciler, refresh_ends
from pytest_haico.submit.shares import Census, Share, item_specs, survey
from pytest_haico.submit.submitting import run_jobs, show


@dataclass(frozen=True)
class Round:
    """What one `haico continue` found and did."""

    decided: tuple[tuple[Share, Decision], ...]
    resubmitted: int

    def with_action(self, *actions: Action) -> list[tuple[Share, Decision]]:
        return [(share, decision) for share, decision in self.decided if decision.action in actions]

    @property
    def finished(self) -> bool:
        return all(decision.action is Action.DONE for _, decision in self.decided)

    @property
    def needs_a_person(self) -> list[tuple[Share, Decision]]:
        return [(s, d) for s, d in self.decided if d.action.needs_a_person]


def continue_(submission: Submission, request: Request, *, say: Say) -> int:
    """One round: 0 when nothing needs a person (every share done, in Slurm, or rerun), 1
    when a share does (its line says why)."""
    return 1 if continue_round(submission, request, say=say).needs_a_person else 0


def continue_round(submission: Submission, request: Request, *, say: Say) -> Round:
    """Decide every share and resubmit those the table reruns (none in a dry run), holding
    the submission's lock unless it is a dry run."""
    if request.dry_run:
        return _round(submission, request, say=say)
    with submission_lock(submission.campaign_dir, submission.name, command="continue", say=say):
        return _round(submission, request, say=say)


def _round(submission: Submission, request: Request, *, say: Say) -> Round:
    journal = Journal(submission.journal)
    jobs = journal.read(warn=say)
    if not jobs:
        raise SubmitError(
            f"{submission.journal} names no job: nothing to continue (if the journal was lost, "
            f"`haico submit {submission.campaign_dir} --stage smoke`, then full, find their jobs "
            "in Slurm by name and record them again)"
        )
    reconciler = Reconciler(submission, journal, request, say=say)
    reconciler.settle(jobs)
    refresh_ends(jobs, journal)
    experiments = load_experiments(submission.experiments)
    rules = Rules(include_cancelled=request.include_cancelled, max_rounds=request.max_rounds)
    census = survey(submission, experiments, jobs, say=say)
    decided = tuple((share, decide(share.evidence, rules)) for share in census.shares)
    exclusions = _exclusions(jobs, census, request)
    if exclusions.nodes:
        decided = _kept_off(decided, exclusions, experiments, say=say)
    for share, decision in decided:
        verdict = _verdict(share, decision)
        say(f"haico: {share.label}: {_end_text(share)}, {share.owed_text}: {verdict}")
    rerun = [share for share, decision in decided if decision.action is Action.RERUN]
    if rerun and exclusions.nodes:
        say(f"haico: the reruns exclude node(s) {exclusions.text()}")
    plans = (
        _plans(submission, experiments, jobs, rerun, request, exclusions.nodes, say=say)
        if rerun
        else []
    )
    result = Round(decided=decided, resubmitted=len(plans))
    if result.finished:
        # A smoke share's items are among the full stage's too: each is counted once.
        items = len({(spec.arm.name, spec.item_id) for share, _ in decided for spec in share.items})
        say(
            f"haico: nothing to continue: every share of submission {submission.name} is "
            f"done ({items} items)"
        )
    elif not plans:
        say(f"haico: nothing to resubmit: {_summary(result)}")
    if request.dry_run:
        show(plans, jobs, submission, experiments, say)
    else:
        _cancel_held(decided, say=say)
        if plans:
            run_jobs(submission, experiments, jobs, plans, reconciler, say=say)
    return result


def _cancel_held(decided: Sequence[tuple[Share, Decision]], *, say: Say) -> None:
    """Cancel the tasks Slurm holds after a failed launch (their shares rerun, or done), so
    that a later `scontrol release` cannot run them again."""
    for share, decision in decided:
        end = share.evidence.end
        if end is not None and end.launch_held and decision.action in (Action.RERUN, Action.DONE):
            try:
                cancel(share.key)
            except SlurmError as exc:
                # Its rerun goes ahead: released one day, it finds its items claimed or done.
                say(f"haico: could not cancel the held task {share.key} ({exc})")
            else:
                say(f"haico: cancelled the held task {share.key}")


def _exclusions(jobs: Mapping[str, JournaledJob], census: Census, request: Request) -> Exclusions:
    """The nodes reruns stay off: every node an earlier round excluded, and every node the
    infrastructure failures now cluster on (none with --no-exclude)."""
    if not request.exclude_nodes:
        return Exclusions(earlier=(), blamed={})
    earlier = tuple(sorted({node for job in jobs.values() for node in job.plan.exclude}))
    return Exclusions(earlier=earlier, blamed=blame(census.placements))


def _kept_off(
    decided: Sequence[tuple[Share, Decision]],
    exclusions: Exclusions,
    experiments: Experiments,
    *,
    say: Say,
) -> tuple[tuple[Share, Decision], ...]:
    """The reruns with their node's exclusion said; a rerun with no node left to run on (every
    node of its partition excluded) stops instead, naming them."""
    try:
        partitions: dict[str, tuple[str, ...]] | None = read_partition_nodes()
    except SlurmError as exc:
        say(f"haico: cannot list the partitions' nodes ({exc}): excluding without that check")
        partitions = None
    kept = []
    for share, decision in decided:
        if decision.action is Action.RERUN:
            arm = experiments.arms[share.job.plan.arm]
            partition = arm.slurm.partition if arm.slurm and arm.slurm.partition else ""
            nodes = (partitions or {}).get(partition, ())
            why = exclusions.why(share.evidence.node)
            if exclusions.leaves_nothing(nodes):
                where = f"partition {partition}" if partition else "the default partition"
                decision = Decision(
                    Action.STOP,
                    f"{decision.reason}, but every node of {where} is excluded: "
                    f"{exclusions.text()}; ask your site to look at them (sinfo -R), then "
                    "`haico continue --no-exclude` runs on them again",
                )
            elif why is not None:
                decision = Decision(Action.RERUN, f"{decision.reason}; {why}")
        kept.append((share, decision))
    return tuple(kept)


def _end_text(share: Share) -> str:
    end = share.evidence.end
    return "unknown to Slurm" if end is None else end.text


def _verdict(share: Share, decision: Decision) -> str:
    if decision.action is Action.DONE:
        return "done"
    if decision.action is Action.RERUN:
        return f"rerun (round {share.round + 1}): {decision.reason}"
    if decision.action is Action.WAIT:
        return decision.reason
    if decision.action is Action.HOLD:
        return decision.reason
    return f"terminal: {decision.reason}"


def _summary(result: Round) -> str:
    """What the shares that are not done are doing."""
    waiting = len(result.with_action(Action.WAIT))
    people = len(result.needs_a_person)
    parts = []
    if waiting:
        parts.append(f"{waiting} share(s) pending or running")
    if people:
        parts.append(f"{people} share(s) need you (above)")
    return ", ".join(parts) or "no share needs a rerun"


def _plans(
    submission: Submission,
    experiments: Experiments,
    jobs: Mapping[str, JournaledJob],
    rerun: Sequence[Share],
    request: Request,
    exclude: tuple[str, ...],
    *,
    say: Say,
) -> list[PlannedJob]:
    """The continuation jobs of the shares to rerun, one stage `continue-<n>` per round, each
    kept off the `exclude` nodes."""
    rounds = {j.plan.stage for j in jobs.values() if j.plan.stage.startswith("continue-")}
    stage = f"continue-{len(rounds) + 1}"
    current = current_items(item_specs(submission, experiments))
    measured = measured_costs(submission.campaign_dir, say, current=current)
    partitions = partition_caps(say)
    by_stratum: dict[tuple[str, str], dict[str, list[Share]]] = {}
    for share in rerun:
        plan = share.job.plan
        by_stratum.setdefault((plan.arm, plan.stratum), {}).setdefault(plan.name, []).append(share)
    plans: list[PlannedJob] = []
    for (arm_name, stratum), by_job in by_stratum.items():
        arm = experiments.arms[arm_name]
        name = job_name(submission, stage, arm_name, stratum)
        if request.tasks is None:
            plans += [
                replace(plan, exclude=exclude)
                for plan in _same_shards(
                    name, stage, by_job, submission, arm, measured, partitions, request
                )
            ]
            continue
        shares = [share for group in by_job.values() for share in group]
        items = list(dict.fromkeys(spec.test_id for share in shares for spec in share.owed))
        task_count = min(request.tasks, len(items))
        items_file = submission.dir / stage / f"{arm_name}.{stratum}.items"
        time, why = _continue_time(
            shares[0].job,
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
                continues={job: tuple(s.task for s in group) for job, group in by_job.items()},
                supersedes=tuple(share.key for share in shares),
                why=f"{why}; {len(items)} owed items over {task_count} tasks",
                exclude=exclude,
            )
        )
        if not request.dry_run:
            _write_items(items_file, items, task_count)
    return plans


def _same_shards(
    name: str,
    stage: str,
    by_job: Mapping[str, Sequence[Share]],
    submission: Submission,
    arm: Arm,
    measured: Mapping[tuple[str, str], StratumCost],
    partitions: list[Partition] | None,
    request: Request,
) -> list[PlannedJob]:
    """One continuation per earlier job (their shard counts may differ), each running the
    same shards again. Its pytest arguments are made anew from the frozen inputs, never
    copied from the journal."""
    plans = []
    for number, (job_name_, shares) in enumerate(by_job.items(), start=1):
        job = shares[0].job
        tasks = tuple(share.task for share in shares)
        time, why = _continue_time(job, arm, measured, partitions, request, tasks=None)
        suffix = "" if len(by_job) == 1 else f"-{number}"
        args = pytest_args(
            submission,
            job.plan.arm,
            job.plan.stratum,
            limit=limit_of(job.plan),
            items=plan_items_file(job.plan),
        )
        plans.append(
            replace(
                job.plan,
                name=name + suffix,
                stage=stage,
                tasks=tasks,
                time_limit=time,
                pytest_args=args,
                depends_on=(),
                continues={job_name_: tasks},
                supersedes=tuple(share.key for share in shares),
                why=why,
                argv=(),
            )
        )
    return plans


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
            concurrency=resolve_concurrency(None, arm.run).maximum,
            partition=resolve_partition(arm, partitions)[0],
            margin=request.margin,
        )
        return plan.time_limit, f"haico cost: {found.n} items measured"
    return job.plan.time_limit, f"as job {job.plan.name}"


def _write_items(path: Path, items: Sequence[str], tasks: int) -> None:
    """The owed items, one test id per line; task k of the array runs lines k, k+tasks, ..."""
    make_dirs(path.parent, DEFAULT_FILE_MODE)
    lines = [
        f"# {len(items)} items over {tasks} array tasks: task k runs the items at positions "
        f"k, k+{tasks}, k+{2 * tasks}, ... (--haico-shard k/{tasks})",
    ]
    lines += list(items)
    write_atomic(path, ("\n".join(lines) + "\n").encode(), mode=DEFAULT_FILE_MODE)
