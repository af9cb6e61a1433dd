"""A submission's shares and what is known of them: each array task of its jobs runs a share
(arm × stratum × task over the frozen selection: the shard, the per-stratum limit or the
items file); a share that a submitted continuation runs again is history, its newest attempt
is the continuation's task. Per share: its items, those the ledgers say it still owes, how
its newest attempt ended, and how many attempts in a row had their chance and recorded
nothing."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property

from pytest_haico.config.experiment import Experiments
from pytest_haico.config.item_list import parse_item_list
from pytest_haico.config.items import (
    ItemSpec,
    in_shard,
    limited_shard,
    submitted_item_specs,
)
from pytest_haico.config.settings import Profile
from pytest_haico.config.shard import Shard
from pytest_haico.ledger.layout import ArmPaths
from pytest_haico.ledger.resume import ResumeIndex
from pytest_haico.ledger.verdicts import Verdict
from pytest_haico.slurm.records import TaskState
from pytest_haico.submit.decisions import Dependency, Evidence, had_its_chance
from pytest_haico.submit.inputs import Submission
from pytest_haico.submit.jobs import Say, limit_of, log_of, plan_items_file
from pytest_haico.submit.journal import JournaledJob, PlannedJob
from pytest_haico.submit.ledgers import ArmLedger
from pytest_haico.submit.nodes import Placement, gate_passed_elsewhere

# (job name, array task): one attempt at a share.
Attempt = tuple[str, int]


@dataclass(frozen=True)
class Share:
    """The newest attempt at a share: one task of a submitted job that no submitted job
    continues, its frozen selection and what is known of it."""

    job: JournaledJob
    task: int
    items: tuple[ItemSpec, ...]
    owed: tuple[ItemSpec, ...]
    interrupted: int  # owed items whose newest record is `interrupted`
    unrecorded: int  # owed items without any record
    round: int  # attempts at this share so far, this one included
    evidence: Evidence

    @property
    def key(self) -> str:
        """``<job id>_<task>``: the job part of its runs' run_ids."""
        return f"{self.job.job_id}_{self.task}"

    @property
    def label(self) -> str:
        plan = self.job.plan
        return f"{plan.stage} {plan.arm}.{plan.stratum} task {self.task} (job {self.key})"

    @property
    def owed_text(self) -> str:
        if not self.owed:
            return f"nothing owed of {len(self.items)} items"
        parts = [
            f"{n} {what}"
            for n, what in (
                (self.interrupted, "interrupted"),
                (self.unrecorded, "without a record"),
            )
            if n
        ]
        details = f" ({', '.join(parts)})" if parts else ""
        return f"{len(self.owed)} of {len(self.items)} items owed{details}"


class Lineage:
    """Which attempts of a submission's jobs are history and which are newest, from the
    journal: a submitted job that continues (name, task) makes that attempt history."""

    def __init__(self, jobs: Mapping[str, JournaledJob]) -> None:
        self.jobs = jobs
        self.submitted = [job for job in jobs.values() if job.job_id is not None]
        self.continued = {
            (name, task)
            for job in self.submitted
            for name, tasks in job.plan.continues.items()
            for task in tasks
        }

    @cached_property
    def newest(self) -> list[Attempt]:
        """Every newest attempt, in the order the jobs were prepared."""
        return [
            (job.plan.name, task)
            for job in self.submitted
            for task in job.plan.tasks
            if (job.plan.name, task) not in self.continued
        ]

    def parents(self, attempt: Attempt) -> list[Attempt]:
        """The attempts `attempt` runs again: the same task of a job with the same selection,
        else (their owed items re-split over new tasks) every task it continues."""
        plan = self.jobs[attempt[0]].plan
        same: list[Attempt] = []
        every: list[Attempt] = []
        for name, tasks in plan.continues.items():
            earlier = self.jobs.get(name)
            every += [(name, task) for task in tasks]
            if earlier is not None and _same_selection(earlier.plan, plan) and attempt[1] in tasks:
                same.append((name, attempt[1]))
        return same or every

    def newest_of(self, name: str) -> list[Attempt]:
        """The newest attempts at the shares of job `name` (its own tasks, or the tasks of
        the continuations that ran them again)."""
        return [a for a in self.newest if name in {n for n, _ in self.ancestry(a)}]

    def ancestry(self, attempt: Attempt) -> Iterator[Attempt]:
        """`attempt` and every attempt it runs again, at any depth."""
        seen = {attempt}
        todo = [attempt]
        while todo:
            current = todo.pop()
            yield current
            for parent in self.parents(current):
                if parent not in seen and parent[0] in self.jobs:
                    seen.add(parent)
                    todo.append(parent)


def _same_selection(earlier: PlannedJob, later: PlannedJob) -> bool:
    return (
        earlier.shard_count == later.shard_count
        and limit_of(earlier) == limit_of(later)
        and plan_items_file(earlier) == plan_items_file(later)
    )


def end_of(job: JournaledJob, task: int) -> TaskState | None:
    """How the journal (refreshed from Slurm) says the task stands; None when Slurm did not
    know it."""
    text = job.ended.get(task)
    return TaskState.from_text(text, job.hosts.get(task)) if text else None


@dataclass(frozen=True)
class Census:
    """The newest attempt at every share of a submission, and where every attempt ran."""

    shares: list[Share]
    placements: list[Placement]


def survey(
    submission: Submission, experiments: Experiments, jobs: Mapping[str, JournaledJob], *, say: Say
) -> Census:
    """The newest attempt at every share of the submission, with its evidence, and every
    attempt's placement on its node."""
    return _Survey(submission, experiments, jobs, say).census()


class _Survey:
    def __init__(
        self,
        submission: Submission,
        experiments: Experiments,
        jobs: Mapping[str, JournaledJob],
        say: Say,
    ) -> None:
        self.submission = submission
        self.jobs = jobs
        self.say = say
        self.lineage = Lineage(jobs)
        self.specs: dict[tuple[str, str], list[ItemSpec]] = {}
        for spec in item_specs(submission, experiments):
            self.specs.setdefault((spec.arm.name, spec.stratum), []).append(spec)
        self.ledgers: dict[str, ArmLedger] = {}
        self.depths: dict[Attempt, tuple[int, int]] = {}

    def census(self) -> Census:
        placements = {
            (job.plan.name, task): self.ledger(job.plan.arm).placements(
                f"{job.job_id}_{task}", end_of(job, task)
            )
            for job in self.lineage.submitted
            for task in job.plan.tasks
        }
        everywhere = [p for found in placements.values() for p in found]
        owed = {attempt: self.owed(attempt) for attempt in self.lineage.newest}
        shares = [
            self.share(attempt, owed, placements[attempt], everywhere)
            for attempt in self.lineage.newest
        ]
        return Census(shares, everywhere)

    def share(
        self,
        attempt: Attempt,
        owed: Mapping[Attempt, Sequence[ItemSpec]],
        placed: Sequence[Placement],
        everywhere: Sequence[Placement],
    ) -> Share:
        job, task = self.jobs[attempt[0]], attempt[1]
        arm = self.ledger(job.plan.arm)
        end = end_of(job, task)
        newest = placed[-1] if placed else None
        node = end.node if end is not None else None
        if node is None and newest is not None:
            node = newest.node
        elsewhere = None if newest is None else gate_passed_elsewhere(newest, everywhere)
        log = log_of(self.submission, job.plan, job.job_id or "", task)
        gate = None
        if end is not None and end.exit_code.partition(":")[0] == "78":
            gate = arm.failed_gate(f"{job.job_id}_{task}")
        dependency = None
        if end is not None and end.state == "CANCELLED" and not log.exists():
            dependency = _dependency(job, self.lineage, owed)
        priors = [arm.index.get(spec.item_id) for spec in owed[attempt]]
        rounds, stalled = self.depth(attempt)
        return Share(
            job=job,
            task=task,
            items=tuple(self.selection(attempt)),
            owed=tuple(owed[attempt]),
            interrupted=sum(1 for p in priors if p and p.verdict is Verdict.INTERRUPTED),
            unrecorded=sum(1 for p in priors if p is None),
            round=rounds,
            evidence=Evidence(
                end=end,
                owed=len(owed[attempt]),
                stalled=stalled,
                gate=gate,
                dependency=dependency,
                log=str(log),
                node=node,
                gate_passed_on=elsewhere,
            ),
        )

    def ledger(self, arm: str) -> ArmLedger:
        if arm not in self.ledgers:
            paths = ArmPaths(self.submission.campaign_dir / arm)
            self.ledgers[arm] = ArmLedger(arm, paths, self.say)
        return self.ledgers[arm]

    def selection(self, attempt: Attempt) -> list[ItemSpec]:
        plan = self.jobs[attempt[0]].plan
        return items_of_task(plan, attempt[1], self.specs.get((plan.arm, plan.stratum), []))

    def owed(self, attempt: Attempt) -> list[ItemSpec]:
        index = self.ledger(self.jobs[attempt[0]].plan.arm).index
        return [spec for spec in self.selection(attempt) if not _done(index, spec)]

    def depth(self, attempt: Attempt) -> tuple[int, int]:
        """The attempt's round (1: the share's first attempt), and how many attempts in a
        row, ending with this one, had their chance and recorded nothing terminal."""
        if attempt not in self.depths:
            self.depths[attempt] = (1, 0)  # a cycle in a damaged journal ends here
            job = self.jobs[attempt[0]]
            key = f"{job.job_id}_{attempt[1]}"
            arm = self.ledger(job.plan.arm)
            fruitful = arm.terminal[key] > 0
            parents = [self.depth(p) for p in self.lineage.parents(attempt) if p[0] in self.jobs]
            rounds = 1 + max((r for r, _ in parents), default=0)
            before = max((s for _, s in parents), default=0)
            counted = had_its_chance(end_of(job, attempt[1]), arm.gates(key))
            stalled = 0 if fruitful else before + int(counted)
            self.depths[attempt] = (rounds, stalled)
        return self.depths[attempt]


def _dependency(
    job: JournaledJob, lineage: Lineage, owed: Mapping[Attempt, Sequence[ItemSpec]]
) -> Dependency | None:
    """Why Slurm cancelled a task that never started: a job it waited for (afterok) had a
    task that did not end COMPLETED. None when none did (the user cancelled it)."""
    failed = [
        name
        for name in job.plan.depends_on
        if (parent := lineage.jobs.get(name)) is not None
        and any(not (e := end_of(parent, t)) or e.state != "COMPLETED" for t in parent.plan.tasks)
    ]
    if not failed:
        return None
    newest = [a for name in failed for a in lineage.newest_of(name)]
    pending = [a for a in newest if owed.get(a)]
    names = ", ".join(sorted({lineage.jobs[n].plan.stage for n in failed}))
    if not pending:
        return Dependency(done=True, detail=f"the {names} shares are")
    return Dependency(done=False, detail=f"the {len(pending)} owing {names} share(s) are")


def _done(index: ResumeIndex, spec: ItemSpec) -> bool:
    prior = index.get(spec.item_id)
    return prior is not None and prior.done


def items_of_task(plan: PlannedJob, task: int, specs: list[ItemSpec]) -> list[ItemSpec]:
    """The items of `specs` (one arm × stratum) that task `task` of a job runs, selected
    as the plugin selects them: by position in an items file, else the per-stratum limit's
    items dealt over the tasks, else by the item_id's shard."""
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
    limit = limit_of(plan)
    if limit is None:
        return [s for s in specs if in_shard(s.item_id, shard)]
    chosen = limited_shard(specs, shard, limit)
    return [s for s in specs if s.ordinal in chosen]


def item_specs(submission: Submission, experiments: Experiments) -> list[ItemSpec]:
    """The submission's items with the ids its jobs give them (`submitted_item_specs`)."""
    site = submission.site()
    return submitted_item_specs(
        experiments,
        Profile(submission.profile),
        site_image=site.get("BACKEND_IMAGE") if site else None,
    )
