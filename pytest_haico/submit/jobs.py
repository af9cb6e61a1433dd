"""The jobs of a submission: their sbatch command lines, submitting them through the
journal, settling with Slurm what a crash left SUBMITTING, and reading how their tasks
ended. Shared by `haico submit` and `haico continue`."""

from __future__ import annotations

import shlex
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from pytest_haico.config.experiment import Experiments, SlurmSection
from pytest_haico.config.frozen import INPUTS_DIGEST_ENV
from pytest_haico.errors import HaicoError
from pytest_haico.report.item_costs import StratumCost, load_costs
from pytest_haico.slurm.client import NotRun, SlurmError
from pytest_haico.slurm.jobs import SubmissionRefused, find_job, sbatch, task_states
from pytest_haico.slurm.timelimits import (
    Partition,
    format_time_limit,
    parse_time_limit,
    read_partitions,
)
from pytest_haico.submit.inputs import Submission
from pytest_haico.submit.journal import JobState, Journal, JournaledJob, PlannedJob

Say = Callable[[str], None]

# How a job may end and be run again: drained (75), out of time, preempted, node lost.
CONTINUABLE = ("FAILED 75:", "TIMEOUT", "PREEMPTED", "NODE_FAIL")


class SubmitError(HaicoError):
    """A submission cannot go ahead as asked; the message says what to do."""


@dataclass(frozen=True)
class Request:
    """What the user asked of `haico submit` or `haico continue`."""

    arms: tuple[str, ...] = ()
    strata: tuple[str, ...] = ()
    time: str | None = None
    tasks: int | None = None
    limit: int = 2
    margin: float = 1.5
    force: tuple[str, ...] = ()
    dry_run: bool = False


def run_jobs(
    submission: Submission,
    experiments: Experiments,
    journal: Journal,
    plans: Sequence[PlannedJob],
    request: Request,
    *,
    say: Say,
    reconciled: bool = False,
) -> int:
    jobs = journal.read(warn=say)
    if not reconciled:
        reconcile(jobs, journal, request, say=say)
        refresh_ends(jobs, journal)
    for plan in plans:
        known = jobs.get(plan.name)
        if known is not None and known.state in (JobState.SUBMITTED, JobState.ENDED):
            say(f"haico: {plan.name}: already submitted as job {known.job_id}")
            continue
        dependency = dependency_of(plan, jobs)
        argv = sbatch_argv(submission, plan, dependency, experiments.arms[plan.arm].slurm)
        plan = replace(plan, argv=tuple(argv))
        journal.prepare(plan)
        journal.submitting(plan.name)
        try:
            job_id = sbatch(argv)
        except (SubmissionRefused, NotRun):
            journal.prepare(plan)  # certainly not in Slurm: back to PREPARED
            raise
        journal.submitted(plan.name, job_id)
        jobs = journal.read(warn=say)
        array = array_spec(plan.tasks)
        say(
            f"haico: {plan.name}: job {job_id}, shards {array} of {plan.shard_count}, "
            f"--time {plan.time_limit} ({plan.why})"
            + (f", after {dependency}" if dependency else "")
        )
    say(f"haico: logs in {submission.logs}; journal {submission.journal}")
    return 0


def dependency_of(plan: PlannedJob, jobs: Mapping[str, JournaledJob]) -> str | None:
    """``afterok:<ids>`` for the jobs `plan` waits for; those that already ended OK are left
    out (Slurm forgets finished jobs after MinJobAge, and then refuses the dependency)."""
    ids: list[str] = []
    for name in plan.depends_on:
        parent = jobs.get(name)
        if parent is None or parent.job_id is None:
            raise SubmitError(
                f"{plan.name} must wait for {name}, which was never submitted: submit the "
                "smoke stage first"
            )
        if parent.state is JobState.ENDED:
            bad = {t: e for t, e in parent.ended.items() if not e.startswith("COMPLETED")}
            if bad:
                task, end = sorted(bad.items())[0]
                raise SubmitError(
                    f"smoke job {name} ({parent.job_id}) task {task} ended {end}: read its log "
                    f"and the checklist before the full stage; continue it with `haico continue`"
                )
            continue
        ids.append(parent.job_id)
    return f"afterok:{':'.join(ids)}" if ids else None


def sbatch_argv(
    submission: Submission,
    plan: PlannedJob,
    dependency: str | None,
    arm_slurm: SlurmSection | None,
) -> list[str]:
    """The exact sbatch command line of a job; the job gets the allow-listed environment
    plus what haico sets (interpreter, digest, shard count)."""
    exports = {
        "HAICO_PYTHON": submission.python,
        INPUTS_DIGEST_ENV: submission.digest,
        "HAICO_SHARD_COUNT": str(plan.shard_count),
    }
    for key, value in exports.items():
        if "," in value:
            raise SubmitError(f"{key}={value} has a comma, which sbatch --export cannot pass")
    argv = [
        "sbatch",
        "--parsable",
        f"--job-name={plan.name}",
        f"--array={array_spec(plan.tasks)}",
        f"--time={plan.time_limit}",
        f"--chdir={submission.dir}",
        f"--output={submission.logs}/{plan.stage}.{plan.arm}.{plan.stratum}-%A_%a.out",
        "--export=ALL," + ",".join(f"{k}={v}" for k, v in exports.items()),
    ]
    if arm_slurm is not None:
        argv += arm_slurm.resource_options()
    if dependency is not None:
        argv += [f"--dependency={dependency}", "--kill-on-invalid-dep=yes"]
    return [*argv, str(submission.script), *plan.pytest_args]


def pytest_args(
    submission: Submission,
    arm: str,
    stratum: str,
    *,
    limit: int | None = None,
    items: Path | None = None,
) -> tuple[str, ...]:
    args = [
        f"--rootdir={submission.dir}",
        "--haico-profile",
        submission.profile,
        "--haico-results",
        str(submission.results),
        "--haico-campaign",
        submission.campaign,
        "--haico-experiments",
        str(submission.experiments),
    ]
    if submission.cluster_env is not None:
        args += ["--haico-cluster-env", str(submission.cluster_env)]
    args += ["--haico-arm", arm, "--haico-stratum", stratum]
    if limit is not None:
        args += ["--haico-limit-per-stratum", str(limit)]
    if items is not None:
        args += ["--haico-items", str(items)]
    return (*args, str(submission.experiments))


def plan_items_file(plan: PlannedJob) -> Path | None:
    args = list(plan.pytest_args)
    return Path(args[args.index("--haico-items") + 1]) if "--haico-items" in args else None


def limit_of(plan: PlannedJob) -> int | None:
    args = list(plan.pytest_args)
    flag = "--haico-limit-per-stratum"
    return int(args[args.index(flag) + 1]) if flag in args else None


def reconcile(
    jobs: dict[str, JournaledJob], journal: Journal, request: Request, *, say: Say
) -> None:
    """A job left SUBMITTING (a crash while sbatch ran) is looked up by its name: found, it
    is recorded SUBMITTED; with no trace it blocks everything unless --force names it."""
    blocked: list[str] = []
    for job in jobs.values():
        if job.state is not JobState.SUBMITTING:
            continue
        found = find_job(job.plan.name, since=job.since)
        if found is not None:
            journal.submitted(job.plan.name, found, how="reconciled by name")
            job.state, job.job_id = JobState.SUBMITTED, found
            say(f"haico: {job.plan.name}: found as job {found} (its submission was cut short)")
        elif job.plan.name in request.force:
            say(f"haico: {job.plan.name}: no trace in Slurm; resubmitting it (--force)")
            job.state = JobState.PREPARED
        else:
            blocked.append(job.plan.name)
    if blocked:
        raise SubmitError(
            f"{blocked[0]} was being submitted when haico stopped, and Slurm has no trace of "
            "it (squeue, sacct, the job completion log): if `squeue --me` and `sacct -X "
            "--name <it>` show no such job, rerun with --force "
            f"{blocked[0]}; if it exists under another name, cancel it first"
        )


def refresh_ends(jobs: dict[str, JournaledJob], journal: Journal) -> None:
    for job in jobs.values():
        if job.state is not JobState.SUBMITTED or job.job_id is None:
            continue
        states = task_states(job.job_id)
        job.ended = {task: state.text for task, state in states.items()}
        if all(t in states and states[t].final for t in job.plan.tasks):
            journal.ended(job.plan.name, job.ended)
            job.state = JobState.ENDED


def job_name(submission: Submission, stage: str, arm: str, stratum: str) -> str:
    """Deterministic: the same stage of the same inputs always has the same name."""
    return f"haico.{submission.campaign}.{submission.name}.{stage}.{arm}.{stratum}"


def measured_costs(campaign_dir: Path, say: Say) -> dict[tuple[str, str], StratumCost]:
    if not any(campaign_dir.glob("*/ledger/*.jsonl")):
        return {}  # nothing measured yet
    return load_costs(campaign_dir, warn=lambda m: say(f"haico: ledger warning: {m}"))


def partition_caps(say: Say) -> list[Partition] | None:
    try:
        return read_partitions()
    except SlurmError as exc:
        say(f"haico: no partition limits ({exc}); walltimes are not capped")
        return None


def checked_time(text: str, where: str) -> str:
    try:
        seconds = parse_time_limit(text)
    except HaicoError as exc:
        raise SubmitError(f"{where}: {exc}") from None
    return text if seconds is None else format_time_limit(seconds)


def array_spec(tasks: Iterable[int]) -> str:
    """0,1,2,5 -> "0-2,5"."""
    ordered = sorted(set(tasks))
    parts: list[str] = []
    start = prev = ordered[0]
    for task in [*ordered[1:], None]:
        if task is not None and task == prev + 1:
            prev = task
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if task is not None:
            start = prev = task
    return ",".join(parts)


def show(
    plans: Sequence[PlannedJob],
    jobs: Mapping[str, JournaledJob],
    submission: Submission,
    experiments: Experiments,
    say: Say,
) -> None:
    for plan in plans:
        known = jobs.get(plan.name)
        if known is not None and known.job_id is not None:
            say(f"# {plan.name}: already submitted as job {known.job_id}")
            continue
        dependency = None
        if plan.depends_on:
            try:
                dependency = dependency_of(plan, jobs)
            except SubmitError:
                dependency = "afterok:" + ":".join(f"<job id of {n}>" for n in plan.depends_on)
        elif plan.stage == "full":
            dependency = f"afterok:<the smoke jobs of arm {plan.arm}>"
        say(f"# {plan.name}: {plan.why}")
        arm_slurm = experiments.arms[plan.arm].slurm
        say(command_text(sbatch_argv(submission, plan, dependency, arm_slurm)))


def command_text(argv: Sequence[str]) -> str:
    """A command line a shell runs as is, one option (with its value) per line."""
    lines: list[list[str]] = []
    awaiting = False  # the previous word is an option whose value follows
    for arg in argv:
        if not lines or not awaiting:
            lines.append([])
        lines[-1].append(shlex.quote(arg))
        awaiting = arg.startswith("--") and "=" not in arg and arg != "--parsable"
    return " \\\n    ".join(" ".join(words) for words in lines)
