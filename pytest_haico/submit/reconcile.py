"""Settling the journal with Slurm before anything is submitted: every job name about to be
submitted, and every journaled job without an id, is looked up in Slurm first (`squeue`,
then `sacct` since the submission's creation); a job found is adopted into the journal,
only a name Slurm has no trace of is submitted, and a case Slurm cannot settle stops with
what to do. An empty, truncated or lost journal therefore never leads to a blind sbatch."""

from __future__ import annotations

from collections.abc import Mapping

from pytest_haico.slurm.jobs import NameLookup, find_job, task_states
from pytest_haico.submit.inputs import Submission
from pytest_haico.submit.jobs import Request, Say, SubmitError
from pytest_haico.submit.journal import JobState, Journal, JournaledJob, PlannedJob


class Reconciler:
    """One command's look-ups of its job names in Slurm, each name asked once.

    `journal_lost`: the submission existed before this command, yet its journal names no
    job (emptied, truncated or lost); on a site whose Slurm keeps no history of finished
    jobs, "no trace" then cannot mean "never submitted".
    """

    def __init__(
        self,
        submission: Submission,
        journal: Journal,
        request: Request,
        *,
        say: Say,
        journal_lost: bool = False,
    ) -> None:
        self.submission = submission
        self.journal = journal
        self.request = request
        self.say = say
        self.journal_lost = journal_lost
        self._looked_up: dict[str, NameLookup] = {}

    def look_up(self, name: str) -> NameLookup:
        if name not in self._looked_up:
            since = str(self.submission.manifest.get("created") or "")
            self._looked_up[name] = find_job(name, since=since or _EPOCH)
        return self._looked_up[name]

    def settle(self, jobs: dict[str, JournaledJob]) -> None:
        """Every journaled job without a job id is looked up: found, it is recorded
        SUBMITTED; one left SUBMITTING (a crash while sbatch ran) with no trace blocks
        everything unless --force names it."""
        blocked: list[str] = []
        for job in jobs.values():
            if job.job_id is not None:
                continue
            found = self.look_up(job.plan.name).job_id
            if found is not None:
                self.journal.submitted(job.plan.name, found, how="reconciled by name")
                if job.state is JobState.SUBMITTING:
                    self.say(
                        f"haico: {job.plan.name}: found as job {found} (its submission was "
                        "cut short)"
                    )
                else:
                    self.say(_adopted(job.plan.name, found))
                job.state, job.job_id = JobState.SUBMITTED, found
            elif job.state is not JobState.SUBMITTING:
                continue  # prepared, never handed to sbatch: submitted when planned again
            elif job.plan.name in self.request.force:
                self.say(f"haico: {job.plan.name}: no trace in Slurm; resubmitting it (--force)")
                job.state = JobState.PREPARED
            else:
                blocked.append(job.plan.name)
        if blocked:
            raise SubmitError(
                f"{blocked[0]} was being submitted when haico stopped, and Slurm has no trace "
                "of it (squeue, sacct, the job completion log): if `squeue --me` and `sacct -X "
                "--name <it>` show no such job, rerun with --force "
                f"{blocked[0]}; if it exists under another name, cancel it first"
            )

    def adopt(self, plan: PlannedJob) -> str | None:
        """Between `plan`'s PREPARED and SUBMITTING: the id of a job Slurm already has under
        its name, adopted into the journal (None: Slurm has no trace, submit it). Raises
        `SubmitError` when Slurm cannot tell."""
        lookup = self.look_up(plan.name)
        if lookup.job_id is not None:
            self.journal.submitted(plan.name, lookup.job_id, how="reconciled by name")
            self.say(_adopted(plan.name, lookup.job_id))
            return lookup.job_id
        if not lookup.history and self.journal_lost and plan.name not in self.request.force:
            raise SubmitError(
                f"the journal {self.journal.path} names no job although submission "
                f"{self.submission.name} exists since {self.submission.manifest.get('created')}"
                ", and this Slurm keeps no record of finished jobs (no accounting, no job "
                f"completion log): haico cannot tell whether {plan.name} ran. If `squeue --me` "
                f"and your own records show it never did, rerun with --force {plan.name}"
            )
        return None


def _adopted(name: str, job_id: str) -> str:
    return (
        f"haico: {name}: found in Slurm as job {job_id}, which the journal did not record: "
        "adopted, not submitted again"
    )


def refresh_ends(jobs: Mapping[str, JournaledJob], journal: Journal) -> None:
    """Each submitted job's tasks as Slurm has them now; a job whose every task is final is
    journaled ENDED (and not asked again)."""
    for job in jobs.values():
        if job.state is not JobState.SUBMITTED or job.job_id is None:
            continue
        states = task_states(job.job_id)
        job.ended = {task: state.text for task, state in states.items()}
        job.hosts = {task: state.node for task, state in states.items() if state.node}
        if all(t in states and states[t].final for t in job.plan.tasks):
            journal.ended(job.plan.name, job.ended, job.hosts)
            job.state = JobState.ENDED


# find_job's "since" for a manifest without a creation time: every job of the name.
_EPOCH = "1970-01-01T00:00:00Z"
