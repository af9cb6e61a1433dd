"""Submitting planned jobs through the journal: each one PREPARED, looked up in Slurm by its
name, SUBMITTING, sbatch, SUBMITTED; its dependency on the newest attempts of the jobs it
waits for; and a dry run's exact command lines."""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import replace

from pytest_haico.config.experiment import Experiments
from pytest_haico.files import shown_path
from pytest_haico.slurm.client import NotRun
from pytest_haico.slurm.jobs import SubmissionRefused, sbatch
from pytest_haico.submit.inputs import Submission
from pytest_haico.submit.jobs import Say, SubmitError, array_spec, sbatch_argv
from pytest_haico.submit.journal import JobState, JournaledJob, PlannedJob, now_iso
from pytest_haico.submit.reconcile import Reconciler
from pytest_haico.submit.shares import Lineage, end_of


def run_jobs(
    submission: Submission,
    experiments: Experiments,
    jobs: dict[str, JournaledJob],
    plans: Sequence[PlannedJob],
    reconciler: Reconciler,
    *,
    say: Say,
) -> None:
    """Submit the plans not yet in Slurm, in order (`jobs`: the settled journal, kept up to
    date); a name Slurm already has is adopted instead."""
    journal = reconciler.journal
    for plan in plans:
        known = jobs.get(plan.name)
        if known is not None and known.job_id is not None:
            say(f"haico: {plan.name}: already submitted as job {known.job_id}")
            continue
        dependency = dependency_of(plan, jobs)
        argv = sbatch_argv(submission, plan, dependency, experiments.arms[plan.arm].slurm)
        plan = replace(plan, argv=tuple(argv))
        journal.prepare(plan)
        adopted = reconciler.adopt(plan)
        if adopted is not None:
            jobs[plan.name] = _submitted(plan, adopted)
            continue
        journal.submitting(plan.name)
        try:
            job_id = sbatch(argv)
        except (SubmissionRefused, NotRun):
            journal.prepare(plan)  # certainly not in Slurm: back to PREPARED
            raise
        journal.submitted(plan.name, job_id)
        jobs[plan.name] = _submitted(plan, job_id)
        say(
            f"haico: {plan.name}: job {job_id}, shards {array_spec(plan.tasks)} of "
            f"{plan.shard_count}, --time {plan.time_limit} ({plan.why})"
            + (f", after {dependency}" if dependency else "")
        )
    say(f"haico: logs in {shown_path(submission.logs)}; journal {shown_path(submission.journal)}")


def _submitted(plan: PlannedJob, job_id: str) -> JournaledJob:
    now = now_iso()
    return JournaledJob(
        plan=plan, state=JobState.SUBMITTED, since=now, prepared_at=now, job_id=job_id
    )


def dependency_of(plan: PlannedJob, jobs: Mapping[str, JournaledJob]) -> str | None:
    """``afterok:<ids>`` for the newest attempts at the shares of the jobs `plan` waits for
    (a smoke task that timed out and was continued counts by its continuation); those that
    ended COMPLETED are left out (Slurm forgets finished jobs after MinJobAge, and then
    refuses the dependency). One that ended otherwise is a `SubmitError`."""
    lineage = Lineage(jobs)
    waits: list[str] = []
    for name in plan.depends_on:
        parent = jobs.get(name)
        if parent is None or parent.job_id is None:
            raise SubmitError(
                f"{plan.name} must wait for {name}, which was never submitted: submit the "
                "smoke stage first"
            )
        running: dict[str, list[int]] = {}
        for job_name, task in lineage.newest_of(name):
            job = jobs[job_name]
            end = end_of(job, task)
            if end is not None and end.final:
                if end.state == "COMPLETED":
                    continue
                raise SubmitError(
                    f"smoke job {job_name} ({job.job_id}) task {task} ended {end.text}: read its "
                    "log and the checklist before the full stage; continue it with `haico "
                    "continue`"
                )
            running.setdefault(job_name, []).append(task)
        for job_name, tasks in running.items():
            job = jobs[job_name]
            # A job some of whose tasks were run again: wait for the newest ones only.
            whole = sorted(tasks) == sorted(job.plan.tasks)
            waits += [str(job.job_id)] if whole else [f"{job.job_id}_{t}" for t in tasks]
    return f"afterok:{':'.join(waits)}" if waits else None


def show(
    plans: Sequence[PlannedJob],
    jobs: Mapping[str, JournaledJob],
    submission: Submission,
    experiments: Experiments,
    say: Say,
) -> None:
    """A dry run: the sbatch command line of each plan not yet submitted."""
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
