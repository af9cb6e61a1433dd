"""Writes each item attempt's ledger record exactly once, the moment the attempt ends."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import pytest

from pytest_haico import __version__
from pytest_haico.config.items import ItemSpec
from pytest_haico.config.slurm import SlurmJob
from pytest_haico.ledger.jsonl import LedgerWriter
from pytest_haico.ledger.records import ErrorInfo, LedgerRecord, SlurmInfo, TurnRecord
from pytest_haico.ledger.rundir import ArmPaths, RunClaim, claim_run_dir, job_part
from pytest_haico.ledger.verdicts import Verdict


def utc_now() -> datetime:
    return datetime.now(UTC)


@dataclass(eq=False)
class ItemAttempt:
    """One haico item's attempt in this session; lives in `item.stash[ATTEMPT_KEY]`.

    Compared and hashed by identity: the runner keys its conversations by it.
    """

    spec: ItemSpec
    nodeid: str
    attempt: int
    started_at: datetime | None = None
    recorded: Verdict | None = field(default=None)


ATTEMPT_KEY = pytest.StashKey[ItemAttempt]()


class Recorder:
    """The campaign's ledger writer: one record per item attempt, claimed run dirs per arm.

    Anything may call `record` (the runner from its worker thread, the report hooks
    from the main thread); the first call for an attempt wins, later ones are ignored.
    """

    def __init__(
        self, *, campaign_dir: Path, campaign: str, job: SlurmJob, max_attempts: int
    ) -> None:
        self.campaign_dir = campaign_dir
        self.campaign = campaign
        self.job = job
        self.max_attempts = max_attempts
        self._job_part = job_part(job)
        self._lock = threading.Lock()
        self._claims: dict[str, RunClaim] = {}
        self._writers: dict[str, LedgerWriter] = {}
        self.verdicts: dict[str, Counter[Verdict]] = {}

    def paths(self, arm: str) -> ArmPaths:
        return ArmPaths(self.campaign_dir / arm)

    def claim(self, arm: str) -> RunClaim:
        """This session's run directory for the arm, claimed on first use."""
        with self._lock:
            return self._claim_locked(arm)

    def record(
        self,
        state: ItemAttempt,
        verdict: Verdict,
        *,
        turns: Iterable[TurnRecord] = (),
        error: ErrorInfo | None = None,
        finished_at: datetime | None = None,
        in_flight_at_start: int = 0,
    ) -> LedgerRecord | None:
        """Append the attempt's record unless it already has one; return what was written."""
        with self._lock:
            if state.recorded is not None:
                return None
            if verdict.counts_as_attempt and state.attempt >= self.max_attempts:
                verdict = Verdict.GAVE_UP
            state.recorded = verdict
            spec = state.spec
            finished = finished_at or utc_now()
            started = state.started_at or finished
            record = LedgerRecord(
                run_id=self._claim_locked(spec.arm.name).run_id,
                campaign=self.campaign,
                arm=spec.arm.name,
                stratum=spec.stratum,
                item_id=spec.item_id,
                nodeid=state.nodeid,
                script=spec.script.id,
                script_sha256=spec.source.sha256,
                repeat=spec.repeat,
                attempt=state.attempt,
                outcome=verdict.outcome,
                verdict=verdict,
                started_at=started.isoformat(timespec="microseconds"),
                finished_at=finished.isoformat(timespec="microseconds"),
                duration_s=round((finished - started).total_seconds(), 6),
                in_flight_at_start=in_flight_at_start,
                model_identity=spec.model_identity,
                backend_identity=spec.backend_identity,
                turns=tuple(turns),
                error=error,
                slurm=slurm_info(self.job),
                harness_version=__version__,
            )
            self._writers[spec.arm.name].append(record)
            self.verdicts.setdefault(spec.arm.name, Counter())[verdict] += 1
            return record

    @property
    def owed_retry(self) -> int:
        """Attempts recorded in this session that a rerun must try again."""
        with self._lock:
            return sum(
                count
                for counter in self.verdicts.values()
                for verdict, count in counter.items()
                if not verdict.is_terminal
            )

    def ledger_paths(self) -> dict[str, Path]:
        with self._lock:
            return {arm: writer.path for arm, writer in self._writers.items()}

    def close(self) -> None:
        with self._lock:
            for writer in self._writers.values():
                writer.close()

    def _claim_locked(self, arm: str) -> RunClaim:
        claim = self._claims.get(arm)
        if claim is None:
            paths = self.paths(arm)
            claim = claim_run_dir(paths, self._job_part)
            self._claims[arm] = claim
            self._writers[arm] = LedgerWriter(paths.ledger(claim.run_id))
        return claim


def slurm_info(job: SlurmJob) -> SlurmInfo | None:
    """The ledger's `slurm` block for this job, or None outside a job."""
    if not job.in_job:
        return None
    return SlurmInfo(
        job_id=job.job_id,
        array_job_id=job.array_job_id,
        array_task_id=job.array_task_id,
        node=job.node,
        restart_count=job.restart_count,
    )
