"""Reading a campaign, an arm or a run into `Results`: its ledgers through the ledger
reader, warnings for the lines skipped, orphan transcripts."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path

from pytest_haico.ledger.format import (
    READABLE_SCHEMAS,
    UnreadableLedgerError,
    Warn,
    iter_ledger,
)
from pytest_haico.results.records import (
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
) -> Results:
    """Read a campaign, an arm or a run (see the module's docstring) into `Results`.

    `run` keeps only that run's records and orphans. Skipped lines are kept in
    `Results.warnings` and also passed to `warn` when given. Raises `NotResultsError`
    for a path that is none of these, `NoRecordsError` when there is no record.
    """
    where = Path(path).expanduser().absolute()
    arms, run = _resolve(where, run)
    warnings: list[str] = []

    def collect(message: str) -> None:
        warnings.append(message)
        if warn is not None:
            warn(message)

    records: list[Record] = []
    orphans: list[Orphan] = []
    with paused_gc():
        for arm_dir in arms:
            arm_records = list(_read_arm(arm_dir, run, collect))
            records += arm_records
            orphans += _orphans(arm_dir, arm_records, run)
    if not records:
        what = f"run {run} under {where}" if run else str(where)
        raise NoRecordsError(
            f"no ledger record in {what} (<arm>/ledger/*.jsonl): run the campaign first "
            "(pytest experiments --haico-campaign <name>), or give another path"
            + (f"; {len(warnings)} line(s) skipped, first: {warnings[0]}" if warnings else "")
        )
    return Results(where, records, orphans, warnings)


def _resolve(where: Path, run: str | None) -> tuple[list[Path], str | None]:
    """The arm directories to read, and the run to keep (None: every run)."""
    hint = (
        "give <results>/<campaign> (it holds <arm>/ledger/), <campaign>/<arm>, "
        "<arm>/runs/<run_id> or <arm>/ledger/<run_id>.jsonl"
    )
    if where.is_file() and where.suffix == ".jsonl" and where.parent.name == "ledger":
        return [where.parent.parent], where.stem
    if not where.exists():
        raise NotResultsError(f"{where} does not exist: {hint}")
    if not where.is_dir():
        raise NotResultsError(f"{where} is not a campaign, an arm or a run: {hint}")
    if where.parent.name == "runs" and (where.parent.parent / "ledger").is_dir():
        return [where.parent.parent], where.name
    if (where / "ledger").is_dir():
        return [where], run
    try:
        arms = sorted(p for p in where.iterdir() if (p / "ledger").is_dir())
    except OSError as exc:
        raise ResultsReadError(
            f"cannot list {where}: [Errno {exc.errno}] {exc.strerror}: make it readable"
        ) from exc
    if not arms:
        raise NotResultsError(f"{where} holds no <arm>/ledger/ directory: {hint}")
    return arms, run


def _read_arm(arm_dir: Path, run: str | None, warn: Warn) -> Iterator[Record]:
    ledger = arm_dir / "ledger"
    try:
        names = sorted(e.name for e in os.scandir(ledger) if e.name.endswith(".jsonl"))
    except OSError as exc:
        raise ResultsReadError(
            f"cannot list the ledger directory {ledger}: [Errno {exc.errno}] {exc.strerror}: "
            "make it readable for this user"
        ) from exc
    for name in names:
        if run is None or name == f"{run}.jsonl":
            yield from _read_ledger(ledger / name, arm_dir, warn)


def _read_ledger(path: Path, arm_dir: Path, warn: Warn) -> list[Record]:
    """Every valid record of one ledger file; skipped lines are warned with file and line."""
    records: list[Record] = []
    append = records.append
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
                append(Record(data, path, number, arm_dir))
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
    return records


def _orphans(arm_dir: Path, records: Sequence[Record], run: str | None) -> list[Orphan]:
    """Transcripts `<item_id>.<run_id>.<attempt>.jsonl` of attempts without a record."""
    try:
        names = [e.name for e in os.scandir(arm_dir / "transcripts")]
    except OSError:
        return []
    recorded = {
        f"{r.data['item_id']}.{r.data['run_id']}.{r.data['attempt']}.jsonl" for r in records
    }
    orphans = []
    for name in sorted(set(names) - recorded):
        item_id, _, rest = name.partition(".")
        run_id, _, attempt = rest.removesuffix(".jsonl").rpartition(".")
        if not name.endswith(".jsonl") or not run_id or not attempt.isdigit():
            continue
        if run is not None and run_id != run:
            continue
        orphans.append(
            Orphan(arm_dir / "transcripts" / name, arm_dir.name, item_id, run_id, int(attempt))
        )
    return orphans
