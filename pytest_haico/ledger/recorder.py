"""Writes each item attempt's ledger record exactly once, the moment the attempt ends."""

from __future__ import annotations

import errno
import threading
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from pytest_haico import __version__
from pytest_haico.config.identity import (
    arm_settings,
    parse_backend_identity,
    parse_model_identity,
)
from pytest_haico.config.item_list import ItemList
from pytest_haico.config.items import ItemSpec
from pytest_haico.config.shard import Shard
from pytest_haico.config.slurm import SlurmJob
from pytest_haico.errors import LedgerWriteError, ResultsError, ShareTakenOverError
from pytest_haico.files import DEFAULT_FILE_MODE, describe_filesystem, make_dirs
from pytest_haico.ledger.claims import Holder, ShareClaim, claim_share
from pytest_haico.ledger.jsonl import LedgerWriter
from pytest_haico.ledger.layout import ArmPaths
from pytest_haico.ledger.records import ErrorInfo, LedgerRecord, SlurmInfo, TurnRecord
from pytest_haico.ledger.rundir import (
    RunClaim,
    claim_run_dir,
    is_unused,
    job_part,
    remove_run_dir,
)
from pytest_haico.ledger.times import AttemptTimes, Stopwatch
from pytest_haico.ledger.verdicts import Verdict
from pytest_haico.redact import PLACEHOLDER, Redactor

# Error messages are capped in the ledger, after redaction (a cut secret would survive it).
MAX_MESSAGE = 2000
_WHOLE = Shard(0, 1)


@dataclass(eq=False)
class ItemAttempt:
    """One haico item's attempt in this session; lives in `item.stash[ATTEMPT_KEY]`.

    Compared and hashed by identity: the runner keys its conversations by it.
    """

    spec: ItemSpec
    nodeid: str
    attempt: int
    # The attempt's pytest start (its protocol hook's): the times of a record that holds
    # no conversation. A conversation's record has the conversation's own times.
    clock: Stopwatch = field(default_factory=Stopwatch)
    recorded: Verdict | None = field(default=None)


ATTEMPT_KEY = pytest.StashKey[ItemAttempt]()


class Recorder:
    """The campaign's ledger writer: one record per item attempt, claimed run dirs per arm.

    Anything may call `record` (the runner from its worker thread, the report hooks
    from the main thread); the first call for an attempt that reaches the disk wins,
    later ones are ignored. Every record passes the arm's redaction filter first.
    """

    def __init__(
        self,
        *,
        campaign_dir: Path,
        campaign: str,
        job: SlurmJob,
        max_attempts: int,
        shard: Shard = _WHOLE,
        item_list: ItemList | None = None,
        file_mode: int = DEFAULT_FILE_MODE,
    ) -> None:
        self.campaign_dir = campaign_dir
        self.campaign = campaign
        self.job = job
        self.max_attempts = max_attempts
        self.shard = shard
        self.item_list = item_list
        self.file_mode = file_mode
        self._job_part = job_part(job)
        self._lock = threading.Lock()
        self._claims: dict[str, RunClaim] = {}
        self._shares: dict[tuple[str, str], ShareClaim] = {}
        self._writers: dict[str, LedgerWriter] = {}
        self._redactors: dict[str, Redactor] = {}
        self.verdicts: dict[str, Counter[Verdict]] = {}
        self.write_failure: LedgerWriteError | None = None

    def paths(self, arm: str) -> ArmPaths:
        return ArmPaths(self.campaign_dir / arm)

    def claim(self, arm: str, strata: Iterable[str] = ()) -> RunClaim:
        """This session's run directory for the arm, claimed on first use, and the arm's
        share of each stratum in `strata`.

        Raises `ResultsError` when the results directory cannot be written, and its
        `ShareClaimedError` when another live run holds one of the shares.
        """
        with self._lock:
            new_run = arm not in self._claims
            claim = self._claim_locked(arm)
            taken: list[tuple[str, str]] = []
            try:
                # In one order for every run, so that of two runs wanting overlapping
                # shares at the same moment one always gets all of its own.
                for stratum in sorted(set(strata)):
                    if (arm, stratum) not in self._shares:
                        self._shares[arm, stratum] = self._claim_share(arm, stratum, claim.run_id)
                        taken.append((arm, stratum))
            except ResultsError:
                for key in taken:
                    self._shares.pop(key).release()
                if new_run:  # a refused run leaves no run directory behind
                    del self._claims[arm], self._writers[arm]
                    remove_run_dir(claim.path)
                raise
            return claim

    @property
    def share(self) -> str:
        """This run's share of each arm × stratum, as messages name it: ``shard 0/2``, or
        with --haico-items ``shard 0/2 of list <key> (--haico-items FILE)``."""
        if self.item_list is None:
            return f"shard {self.shard}"
        return (
            f"shard {self.shard} of list {self.item_list.key} (--haico-items {self.item_list.path})"
        )

    def use_redactor(self, arm: str, redactor: Redactor) -> None:
        """Filter the arm's records through `redactor` (the one that knows its stack's secrets)."""
        with self._lock:
            self._redactors[arm] = redactor

    def record(
        self,
        state: ItemAttempt,
        verdict: Verdict,
        *,
        turns: Iterable[TurnRecord] = (),
        error: ErrorInfo | None = None,
        times: AttemptTimes | None = None,
        in_flight_at_start: int = 0,
    ) -> LedgerRecord | None:
        """Append the attempt's record unless it already has one; return what was written.

        `times` are what the conversation measured; without them the span from the
        attempt's pytest start (`state.clock`) to now. The record's `started_at`,
        `finished_at` and `duration_s` are that one span's (see `ledger.times`).

        The attempt counts as recorded once the record is fsynced. Raises
        `LedgerWriteError` when it could not be; `write_failure` keeps the first.
        """
        with self._lock:
            if state.recorded is not None:
                return None
            if verdict.counts_as_attempt and state.attempt >= self.max_attempts:
                verdict = Verdict.GAVE_UP
            spec = state.spec
            redactor = self._redactors.get(spec.arm.name) or Redactor()
            if error is not None:
                message = redactor.redact(error.message)[:MAX_MESSAGE]
                error = ErrorInfo(kind=error.kind, message=message)
            times = times or state.clock.read()
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
                started_at=times.started_at.isoformat(timespec="microseconds"),
                finished_at=times.finished_at.isoformat(timespec="microseconds"),
                duration_s=round(times.duration_s, 6),
                in_flight_at_start=in_flight_at_start,
                model_identity=parse_model_identity(spec.model_identity),
                backend_identity=parse_backend_identity(spec.backend_identity),
                tags=tuple(spec.script.tags),
                settings=arm_settings(spec.arm),
                turns=tuple(turns),
                error=error,
                slurm=slurm_info(self.job),
                harness_version=__version__,
            )
            record = redact_record(record, redactor)
            try:
                self._check_share(spec.arm.name, spec.stratum)
                self._writers[spec.arm.name].append(record)
            except LedgerWriteError as exc:
                self.write_failure = self.write_failure or exc
                raise
            state.recorded = verdict
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
        """Close the ledgers and give up the share claims; a run directory claimed for
        nothing (a rerun with every item done) is removed."""
        with self._lock:
            for arm, writer in self._writers.items():
                writer.close()
                claim = self._claims[arm]
                if not writer.path.exists() and is_unused(claim.path):
                    remove_run_dir(claim.path)
            for share in self._shares.values():
                share.release()
            self._shares.clear()

    def _claim_locked(self, arm: str) -> RunClaim:
        claim = self._claims.get(arm)
        if claim is None:
            paths = self.paths(arm)
            try:
                node = self.job.node if self.job.in_job else None
                claim = claim_run_dir(paths, self._job_part, node=node, file_mode=self.file_mode)
            except OSError as exc:
                raise self._unwritable(exc, paths.runs_dir) from exc
            self._claims[arm] = claim
            self._writers[arm] = LedgerWriter(paths.ledger(claim.run_id), file_mode=self.file_mode)
        return claim

    def share_taken(self, arm: str) -> tuple[str, Path] | None:
        """Who took one of this run's shares of `arm` (a requeue of its job, or a
        continuation, while this run lived on), and that claim's file; None while this run
        holds every share it claimed."""
        with self._lock:
            claims = [claim for (of, _), claim in sorted(self._shares.items()) if of == arm]
        for claim in claims:
            taker = claim.taken_by()
            if taker is not None:
                return taker, claim.path
        return None

    def _check_share(self, arm: str, stratum: str) -> None:
        """Raise `ShareTakenOverError` when this run's share is no longer its own."""
        claim = self._shares.get((arm, stratum))
        taker = claim.taken_by() if claim is not None else None
        if taker is not None:
            raise ShareTakenOverError(
                f"arm {arm}, {self.share}, stratum {stratum}: {taker} took this run's share "
                "while this run lived on (its job was requeued, or ended and continued); this "
                "run records nothing more and stops"
            )

    def _claim_share(self, arm: str, stratum: str, run_id: str) -> ShareClaim:
        # A list's shards are by position, unrelated to the id-hash shards of the same I/N:
        # its claims are its own, and a second run of the same list and shard is refused.
        list_key = self.item_list.key if self.item_list is not None else None
        path = self.paths(arm).share_claim(self.shard, stratum, list_key=list_key)
        share = f"arm {arm}, {self.share}, stratum {stratum}"
        me = Holder.current(self.job, run_id)
        try:
            make_dirs(path.parent, self.file_mode)
            return claim_share(path, me, share=share, file_mode=self.file_mode)
        except OSError as exc:
            raise self._unwritable(exc, path) from exc

    def _unwritable(self, exc: OSError, path: Path) -> ResultsError:
        results = self.campaign_dir.parent
        failed = Path(exc.filename) if exc.filename else path
        problem = f"cannot write to the results directory {results}: {failed}: [Errno {exc.errno}]"
        if exc.errno in (errno.ENOTDIR, errno.EEXIST):
            return ResultsError(
                f"{problem} {exc.strerror}; the results need a directory there: move it aside, "
                "then rerun"
            )
        return ResultsError(
            f"{problem} {exc.strerror} on {describe_filesystem(failed)}. Use a writable file "
            "system with free space: --haico-results DIR (ini haico_results, env "
            "PYTEST_HAICO_RESULTS), or CLUSTER_WORK (results go to $CLUSTER_WORK/results)"
        )


def redact_record(record: LedgerRecord, redactor: Redactor) -> LedgerRecord:
    """The record with every string passed through `redactor` (itself when nothing changed)."""
    # `dumps` searches the encoded record once and redacts string by string only when
    # something may be a secret: 5x cheaper than walking every string of every turn.
    text = redactor.dumps(record.model_dump(mode="json", by_alias=True))
    return LedgerRecord.model_validate_json(text) if PLACEHOLDER in text else record


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
