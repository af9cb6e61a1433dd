"""The results API's types: a record as read, an orphan transcript, what was loaded, and the
errors (see `pytest_haico.results`)."""

from __future__ import annotations

import contextlib
import gc
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from pytest_haico.errors import HaicoError
from pytest_haico.files import NotAnInputError, read_results_file
from pytest_haico.ledger.layout import ArmPaths
from pytest_haico.ledger.verdicts import Verdict

if TYPE_CHECKING:
    import pandas

_TRANSCRIPT_HEADER = "haico_transcript"


class ResultsReadError(HaicoError):
    """The results cannot be read as asked; the message names the path and what to do."""


class NotResultsError(ResultsReadError):
    """The path is not a campaign, an arm or a run directory."""


class NoRecordsError(ResultsReadError):
    """The campaign, arm or run has no ledger record (yet)."""


class TranscriptMissingError(ResultsReadError):
    """A record's transcript file does not exist."""


class MissingExtraError(ResultsReadError):
    """An optional extra (pandas, matplotlib) is needed and not installed."""


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """No cyclic garbage collection inside: parsed records are millions of containers that
    live on, and the collector would walk them all again and again (4x slower reads).

    On the way out every object is promoted to the oldest generation (`freeze` then
    `unfreeze`, two list splices) instead of being walked by the first young collection
    after `enable`, which would cost a second per 100,000 records.
    """
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.freeze()
            gc.unfreeze()
            gc.enable()


def require(module: str, extra: str, what: str) -> Any:
    """Import an optional dependency, or raise `MissingExtraError` naming the extra."""
    try:
        return __import__(module)
    except ImportError:
        raise MissingExtraError(
            f"{what} needs {module}, which is not installed: pip install 'pytest-haico[{extra}]'"
        ) from None


# The keys of a record's data that `Record`'s properties and `Attempt` read.
RECORD_FIELDS = (
    "schema",
    "arm",
    "item_id",
    "run_id",
    "attempt",
    "verdict",
    "started_at",
    "finished_at",
    "duration_s",
    "stratum",
    "script",
    "repeat",
)


class Record:
    """One ledger line (an item attempt) as written, and where it was read.

    `data` is the record's JSON object (schema 1 or 2), or its `RECORD_FIELDS` and the
    fields a caller of `load_results(..., newest_only=True, fields=...)` asked for; the
    properties read its common fields.
    """

    __slots__ = ("arm", "arm_dir", "data", "line", "path")

    def __init__(self, data: dict[str, Any], path: Path, line: int, arm_dir: Path) -> None:
        arm = data.get("arm")
        #: The record's arm (its directory's name when the record names none).
        self.arm: str = arm if type(arm) is str and arm else arm_dir.name
        self.data = data
        self.path = path
        self.line = line
        self.arm_dir = arm_dir

    def __repr__(self) -> str:
        return f"<Record {self.arm} {self.script}-r{self.repeat} #{self.attempt} {self.verdict}>"

    @property
    def item_id(self) -> str:
        return str(self.data["item_id"])

    @property
    def run_id(self) -> str:
        return str(self.data["run_id"])

    @property
    def attempt(self) -> int:
        return int(self.data["attempt"])

    @property
    def verdict(self) -> str:
        return str(self.data["verdict"])

    @property
    def stratum(self) -> str:
        return str(self.data.get("stratum", ""))

    @property
    def script(self) -> str:
        return str(self.data.get("script", ""))

    @property
    def repeat(self) -> int:
        return int(self.data.get("repeat") or 0)

    @property
    def finished_at(self) -> str:
        return str(self.data["finished_at"])

    @property
    def duration_s(self) -> float | None:
        value = self.data.get("duration_s")
        return float(value) if isinstance(value, int | float) else None

    @property
    def turns(self) -> list[dict[str, Any]]:
        turns = self.data.get("turns")
        return [t for t in turns if isinstance(t, dict)] if isinstance(turns, list) else []

    @property
    def transcript_path(self) -> Path:
        return ArmPaths(self.arm_dir).transcript(self.item_id, self.run_id, self.attempt)


# What a record is to its item (`Results.attempt_kinds`).
FIRST, RETRY, RERUN = "first", "retry", "rerun"
_OWED = frozenset(verdict.value for verdict in Verdict if not verdict.is_terminal)


@dataclass(frozen=True)
class Orphan:
    """A transcript whose attempt has no record: the attempt was killed mid-item."""

    path: Path
    arm: str
    item_id: str
    run_id: str
    attempt: int


class Attempt(NamedTuple):
    """What counting needs of one record (a few strings): kept of every record read, also
    when `load_results(..., newest_only=True)` keeps only each item's newest `Record`."""

    arm: str
    arm_dir: Path
    item_id: str
    run_id: str
    attempt: int
    stratum: str
    verdict: str
    started_at: str | None
    finished_at: str
    node: str | None  # the Slurm node it ran on (`slurm.node`), None outside a job

    @classmethod
    def of(cls, record: Record) -> Attempt:
        data = record.data
        started = data.get("started_at")
        slurm = data.get("slurm")
        node = slurm.get("node") if type(slurm) is dict else None
        return cls(
            record.arm,
            record.arm_dir,
            data["item_id"],
            data["run_id"],
            data["attempt"],
            record.stratum,
            data["verdict"],
            started if type(started) is str and started else None,
            data["finished_at"],
            node if type(node) is str and node else None,
        )


@dataclass
class Results:
    """What `load_results` read: the records (every one, or each item's newest), what
    counting needs of every record read (`attempts`), the orphan transcripts, the
    warnings."""

    path: Path
    records: list[Record]
    orphans: list[Orphan] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    newest_only: bool = False  # `records` holds each item's newest only
    # With newest_only, the attempts of every record read (else made from `records`).
    read_attempts: list[Attempt] | None = field(default=None, repr=False)

    @property
    def attempts(self) -> list[Attempt]:
        """What counting needs of every record read, in ledger order."""
        if self.read_attempts is None:
            self.read_attempts = [Attempt.of(record) for record in self.records]
        return self.read_attempts

    def newest(self) -> list[Record]:
        """Each item's newest record (by arm and item_id), in ledger order.

        The rule resume uses (`ResumeIndex`): the later `finished_at` wins, and of two
        equal ones the later line (runs are read by name, lines in write order).
        """
        if self.newest_only:  # the reader kept these only, by the same rule
            return list(self.records)
        newest: dict[tuple[str, str], Record] = {}
        for record in self.records:  # item_id and finished_at: strings (the reader checked)
            data = record.data
            key = (record.arm, data["item_id"])
            known = newest.get(key)
            if known is None or data["finished_at"] >= known.data["finished_at"]:
                newest[key] = record
        keep = {id(record) for record in newest.values()}
        return [record for record in self.records if id(record) in keep]

    def attempt_kinds(self) -> list[str]:
        """What each record read (in `attempts`' order, `records`' unless only the newest
        were kept) is to its item (by arm and item_id): `FIRST`, its first record; `RETRY`,
        an attempt after one the ledger left owed (infra_error, rate_limited, interrupted:
        resume runs it again, in the same run or a later one); `RERUN`, a record after a
        done one (a deliberate rerun: --haico-no-resume). "After" is the order `newest`
        decides by: `finished_at`, then the line."""
        attempts = self.attempts
        kinds = [FIRST] * len(attempts)
        order = sorted(range(len(attempts)), key=lambda i: attempts[i].finished_at)
        before: dict[tuple[str, str], str] = {}
        for index in order:
            attempt = attempts[index]
            key = (attempt.arm, attempt.item_id)
            if key in before:
                kinds[index] = RETRY if before[key] in _OWED else RERUN
            before[key] = attempt.verdict
        return kinds

    def transcript(self, record: Record) -> list[dict[str, Any]]:
        """The record's transcript: its event lines, without the schema-2 header line.

        A missing file is a `TranscriptMissingError`; unreadable lines are skipped.
        """
        path = record.transcript_path
        try:
            raw = read_results_file(path)
        except FileNotFoundError:
            raise TranscriptMissingError(
                f"the transcript {path} of {record.arm} {record.script}-r{record.repeat} "
                f"attempt {record.attempt} is missing: it was moved or deleted, or the "
                "attempt ended before its first event"
            ) from None
        except OSError as exc:
            raise ResultsReadError(
                f"cannot read the transcript {path}: [Errno {exc.errno}] {exc.strerror}: "
                "make it readable for this user"
            ) from exc
        except NotAnInputError as exc:
            raise ResultsReadError(
                f"cannot read the transcript {path}: it {exc.problem}: move it out of {path.parent}"
            ) from exc
        events = []
        for line in raw.splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict) and _TRANSCRIPT_HEADER not in event:
                events.append(event)
        return events

    def frame(self, *, newest: bool = False) -> pandas.DataFrame:
        """One row per record (per item with `newest`), nested fields flattened."""
        from pytest_haico.results.frame import records_frame

        self._every_record("frame()")
        return records_frame(self, newest=newest)

    def compare(
        self, other: Results, *, pass_rule: str | None = None, confidence: float = 0.95
    ) -> pandas.DataFrame:
        """This side (A) paired with `other` (B) by item, as `haico compare` prints it: one
        row per stratum, then "overall" (pass rates with Wilson intervals, the paired
        difference B − A with Newcombe's interval, McNemar's exact p, bootstrap medians of
        latency, tokens and turns, left-out and unpaired counts). `pass_rule` ("all", "any",
        "majority", "k_of_n:K/N") pairs scripts, each one's repeats made one verdict."""
        from pytest_haico.config.pass_rule import parse_pass_rule
        from pytest_haico.results.paired import compare_records, comparison_frame

        rule = None if pass_rule is None else parse_pass_rule(pass_rule)
        comparison = compare_records(
            self.newest(), other.newest(), pass_rule=rule, confidence=confidence
        )
        return comparison_frame(comparison)

    def turns_frame(self, *, newest: bool = False) -> pandas.DataFrame:
        """One row per turn: the record's arm, script, repeat, attempt, run_id, verdict,
        item_id, then the turn's own fields (nested ones flattened)."""
        from pytest_haico.results.frame import turns_frame

        if not newest:
            self._every_record("turns_frame()")
        return turns_frame(self, newest=newest)

    def _every_record(self, what: str) -> None:
        if self.newest_only:
            raise ResultsReadError(
                f"{what} needs every record, and {self.path} was loaded with "
                "newest_only=True: load it with load_results(path)"
            )
