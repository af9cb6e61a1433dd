"""Reading a campaign, an arm or a run into `Results`: ledger lines of schema 1 and 2,
warnings for the lines skipped, orphan transcripts."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from pytest_haico.results.records import (
    NoRecordsError,
    NotResultsError,
    Orphan,
    Record,
    Results,
    ResultsReadError,
    paused_gc,
)

Warn = Callable[[str], None]

#: The ledger schemas this module reads.
SCHEMAS = frozenset({1, 2})

_loads: Callable[[bytes], Any]
try:  # 4-5x faster on long records; in the `analysis` and `report` extras
    from orjson import loads as _loads
except ImportError:  # pragma: no cover - depends on the installed extras
    _loads = json.loads


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
    try:
        # Non-blocking: opening a FIFO for reading would wait for a writer for ever.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                warn(f"{path}: skipped, not a regular file")
                return []
            with os.fdopen(fd, "rb", closefd=False) as handle:
                content = handle.read()
        finally:
            os.close(fd)
    except OSError as exc:
        raise ResultsReadError(
            f"cannot read the ledger {path}: [Errno {exc.errno}] {exc.strerror}: "
            "make it readable for this user"
        ) from exc
    lines = content.split(b"\n")
    last = len(lines)
    loads = _loads
    records: list[Record] = []
    append = records.append
    for number, raw in enumerate(lines, 1):
        try:
            data = loads(raw)
        except ValueError:
            if raw.strip():
                torn = number == last
                warn(f"{path}:{number}: skipped {_TORN if torn else 'not valid JSON'}")
            continue
        # The common case in one test; anything else is diagnosed below.
        if (
            type(data) is dict
            and data.get("schema") in SCHEMAS
            and type(data.get("item_id")) is str
            and type(data.get("run_id")) is str
            and type(data.get("attempt")) is int
            and type(data.get("verdict")) is str
            and type(data.get("finished_at")) is str
        ):
            append(Record(data, path, number, arm_dir))
        else:
            warn(f"{path}:{number}: {_skipped(data)}")
    return records


_TORN = "a torn last line (a kill mid-write?)"


def _skipped(data: object) -> str:
    """Why a parsed line is no record this package reads."""
    if type(data) is not dict:
        return "skipped, not a JSON object"
    schema = data.get("schema")
    if schema not in SCHEMAS:
        if isinstance(schema, int) and schema > max(SCHEMAS):
            return (
                f"skipped a record of schema {schema}, newer than this pytest-haico reads; "
                "upgrade pytest-haico"
            )
        return f"skipped a record of schema {schema!r}, not a known ledger schema"
    return "skipped a record without a valid item_id, run_id, attempt, verdict or finished_at"


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
