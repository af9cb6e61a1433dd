"""Reading a campaign, an arm or a run into `Results`: its ledgers through the ledger
reader, warnings for the lines skipped, orphan transcripts."""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Iterable, Iterator
from operator import itemgetter
from pathlib import Path
from typing import Any

from pytest_haico.ledger.format import (
    READABLE_SCHEMAS,
    UnreadableLedgerError,
    Warn,
    iter_ledger,
)
from pytest_haico.ledger.layout import (
    ArmPaths,
    arm_of_ledger,
    arm_of_run_dir,
    is_arm_dir,
    iter_arm_dirs,
    parse_transcript_name,
    run_id_of_ledger,
    transcript_name,
)
from pytest_haico.results.records import (
    RECORD_FIELDS,
    Attempt,
    NoRecordsError,
    NotResultsError,
    Orphan,
    Record,
    Results,
    ResultsReadError,
    paused_gc,
)

#: The ledger schemas this module reads.
SCHEMAS = READABLE_SCHEMAS


def load_results(
    path: str | os.PathLike[str],
    *,
    run: str | None = None,
    warn: Warn | None = None,
    newest_only: bool = False,
    fields: Collection[str] | None = None,
) -> Results:
    """Read a campaign, an arm or a run (see the module's docstring) into `Results`.

    `run` keeps only that run's records and orphans. Skipped lines are kept in
    `Results.warnings` and also passed to `warn` when given. `newest_only` streams: it
    keeps each item's newest `Record` (`records` is `newest()`), and of the others only
    their `Attempt` (a few strings each), so memory grows with the items, not with the
    attempts. `fields` (with `newest_only`) keeps of each newest record only what the
    properties of `Record` read and these keys (`turns.<key>`: that key of each turn).
    Raises `NotResultsError` for a path that is none of these, `NoRecordsError` when
    there is no record.
    """
    where = Path(path).expanduser().absolute()
    arms, run = _resolve(where, run)
    warnings: list[str] = []

    def collect(message: str) -> None:
        warnings.append(message)
        if warn is not None:
            warn(message)

    records: list[Record] = []
    attempts: list[Attempt] = []
    orphans: list[Orphan] = []
    with paused_gc():
        for arm_dir in arms:
            read = _read_arm(arm_dir, run, collect)
            if newest_only:
                arm_attempts: list[Attempt] = []
                records += _newest(read, arm_attempts, _slimmer(fields))
                attempts += arm_attempts
                ids = [(a.item_id, a.run_id, a.attempt) for a in arm_attempts]
            else:
                arm_records = list(read)
                records += arm_records
                ids = [
                    (r.data["item_id"], r.data["run_id"], r.data["attempt"]) for r in arm_records
                ]
            orphans += _orphans(arm_dir, ids, run)
    if not records:
        what = f"run {run} under {where}" if run else str(where)
        raise NoRecordsError(
            f"no ledger record in {what} (<arm>/ledger/*.jsonl): run the campaign first "
            "(pytest experiments --haico-campaign <name>), or give another path"
            + (f"; {len(warnings)} line(s) skipped, first: {warnings[0]}" if warnings else "")
        )
    if not newest_only:
        return Results(where, records, orphans, warnings)
    return Results(where, records, orphans, warnings, newest_only=True, read_attempts=attempts)


def _newest(
    records: Iterable[Record],
    attempts: list[Attempt],
    slim: Callable[[dict[str, Any]], dict[str, Any]] | None,
) -> list[Record]:
    """Each item's newest of `records` (newest()'s rule), in ledger order, its data made
    `slim`; the `Attempt` of every one appended to `attempts`, the rest let go as read."""
    newest: dict[str, Record] = {}  # in the order each item's newest was read
    add = attempts.append
    of = Attempt.of
    for record in records:
        add(of(record))
        data = record.data
        item_id = data["item_id"]
        known = newest.get(item_id)
        if known is None or data["finished_at"] >= known.data["finished_at"]:
            if slim is not None:
                record.data = slim(data)
            if known is not None:  # to the end: where its newest record was read
                del newest[item_id]
            newest[item_id] = record
    return list(newest.values())


def _slimmer(fields: Collection[str] | None) -> Callable[[dict[str, Any]], dict[str, Any]] | None:
    """A function that keeps of a record's data its `RECORD_FIELDS` and `fields` (None:
    no function, the data stays whole)."""
    if fields is None:
        return None
    others = tuple(f for f in fields if "." not in f and f not in RECORD_FIELDS)
    turn_keys = tuple(f.removeprefix("turns.") for f in fields if f.startswith("turns."))
    # Every line the writer writes has every one of RECORD_FIELDS (they lead it).
    leading = itemgetter(*RECORD_FIELDS)

    def slim(data: dict[str, Any]) -> dict[str, Any]:
        try:
            kept = dict(zip(RECORD_FIELDS, leading(data), strict=True))
        except KeyError:
            kept = {key: data[key] for key in RECORD_FIELDS if key in data}
        for key in others:
            if key in data:
                kept[key] = data[key]
        turns = data.get("turns")
        if turn_keys and type(turns) is list:
            slimmed = []
            for turn in turns:
                kept_turn = {}
                if type(turn) is dict:
                    for key in turn_keys:
                        if key in turn:
                            kept_turn[key] = turn[key]
                slimmed.append(kept_turn)
            kept["turns"] = slimmed
        return kept

    return slim


def _resolve(where: Path, run: str | None) -> tuple[list[Path], str | None]:
    """The arm directories to read, and the run to keep (None: every run)."""
    hint = (
        "give <results>/<campaign> (it holds <arm>/ledger/), <campaign>/<arm>, "
        "<arm>/runs/<run_id> or <arm>/ledger/<run_id>.jsonl"
    )
    ledger_arm = arm_of_ledger(where) if where.is_file() else None
    if ledger_arm is not None:
        return [ledger_arm.root], run_id_of_ledger(where)
    if not where.exists():
        raise NotResultsError(f"{where} does not exist: {hint}")
    if not where.is_dir():
        raise NotResultsError(f"{where} is not a campaign, an arm or a run: {hint}")
    run_arm = arm_of_run_dir(where)
    if run_arm is not None:
        return [run_arm.root], where.name
    if is_arm_dir(where):
        return [where], run
    try:
        arms = list(iter_arm_dirs(where))
    except OSError as exc:
        raise ResultsReadError(
            f"cannot list {where}: [Errno {exc.errno}] {exc.strerror}: make it readable"
        ) from exc
    if not arms:
        raise NotResultsError(f"{where} holds no <arm>/ledger/ directory: {hint}")
    return arms, run


def _read_arm(arm_dir: Path, run: str | None, warn: Warn) -> Iterator[Record]:
    paths = ArmPaths(arm_dir)
    ledger = paths.ledger_dir
    try:
        names = paths.ledger_names()
    except OSError as exc:
        raise ResultsReadError(
            f"cannot list the ledger directory {ledger}: [Errno {exc.errno}] {exc.strerror}: "
            "make it readable for this user"
        ) from exc
    for name in names:
        if run is None or name == paths.ledger(run).name:
            yield from _read_ledger(ledger / name, arm_dir, warn)


def _read_ledger(path: Path, arm_dir: Path, warn: Warn) -> Iterator[Record]:
    """Stream the valid records of one ledger file; skipped lines are warned with file and
    line. Each record is yielded as it is parsed: what its reader does with it then finds it
    in the CPU's cache (a file's records collected first would cost 50% more)."""
    try:
        for data, _, number in iter_ledger(path, warn=warn):
            # The fields every property of `Record` reads, in one test.
            if (
                type(data.get("item_id")) is str
                and type(data.get("run_id")) is str
                and type(data.get("attempt")) is int
                and type(data.get("verdict")) is str
                and type(data.get("finished_at")) is str
            ):
                yield Record(data, path, number, arm_dir)
            else:
                warn(
                    f"{path}:{number}: skipped a record without a valid item_id, run_id, "
                    "attempt, verdict or finished_at"
                )
    except UnreadableLedgerError as exc:
        if exc.regular:
            raise ResultsReadError(
                f"cannot read the ledger {path}: {exc.problem}: {exc.fix}"
            ) from exc
        warn(f"{path}: skipped, not a regular file")


def _orphans(
    arm_dir: Path, recorded_ids: Iterable[tuple[str, str, int]], run: str | None
) -> list[Orphan]:
    """Transcripts `<item_id>.<run_id>.<attempt>.jsonl` of attempts without a record
    (`recorded_ids`: the arm's records' item_id, run_id and attempt)."""
    directory = ArmPaths(arm_dir).transcripts_dir
    try:
        names = set(os.listdir(directory))
    except OSError:
        return []
    recorded = {transcript_name(*ids) for ids in recorded_ids}
    orphans = []
    for name in sorted(names - recorded):
        parsed = parse_transcript_name(name)
        if parsed is None or (run is not None and parsed.run_id != run):
            continue
        orphans.append(
            Orphan(directory / name, arm_dir.name, parsed.item_id, parsed.run_id, parsed.attempt)
        )
    return orphans
