"""The results API's pandas frames (records and turns, nested fields flattened) and the
flattening rules: identities that hold JSON, turn sums, failed expectations."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from pytest_haico.ledger.layout import ArmPaths, transcript_name
from pytest_haico.results.records import RERUN, RETRY, Record, Results, paused_gc, require

if TYPE_CHECKING:
    import pandas


def parse_identity(value: object) -> dict[str, Any] | None:
    """An identity as an object: schema 2's object, or schema 1's string when it holds
    JSON (`{...}`, or `kind:{...}`, whose prefix becomes the `kind` key); else None."""
    if isinstance(value, dict):
        return value
    if not isinstance(value, str):
        return None
    start = value.find("{")
    if start < 0 or (start > 0 and value[start - 1] != ":"):
        return None
    try:
        parsed = json.loads(value[start:])
    except ValueError:
        return None
    if not isinstance(parsed, dict):
        return None
    return {"kind": value[: start - 1], **parsed} if start else parsed


TURN_SUMS = (
    "latency_s",
    "first_event_s",
    "steps",
    "tool_calls",
    "tool_errors",
    "tokens_in",
    "tokens_out",
)


def summarize_turns(turns: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """`n_turns` and the sums of a record's per-turn figures (None where no turn has one),
    plus `turns.expectations_failed` (failed expectation results, schema 2)."""
    sums: dict[str, Any] = dict.fromkeys(TURN_SUMS)
    n = 0
    failed = 0
    for turn in turns:
        n += 1
        for key in TURN_SUMS:
            value = turn.get(key)
            if isinstance(value, int | float) and not isinstance(value, bool):
                known = sums[key]
                sums[key] = value if known is None else known + value
        expectations = turn.get("expectations")
        if isinstance(expectations, list):
            failed += sum(1 for e in expectations if expectation_failed(e))
    out = {"n_turns": n}
    out.update((f"turns.{key}", value) for key, value in sums.items())
    out["turns.expectations_failed"] = failed
    return out


def expectation_failed(result: object) -> bool:
    if not isinstance(result, dict):
        return False
    for key in ("passed", "ok", "met"):
        if key in result:
            return result[key] is False
    return bool(result.get("failed"))


IDENTITIES = ("model_identity", "backend_identity")
# Leading columns, in this order; the turn sums follow, then the others as first seen.
FIRST = (
    "arm",
    "stratum",
    "script",
    "repeat",
    "attempt",
    "verdict",
    "outcome",
    "run_id",
    "item_id",
    "duration_s",
)
_RECORD_KEYS = ("arm", "script", "repeat", "attempt", "run_id", "verdict", "item_id")


def _flatten(prefix: str, value: dict[str, Any], out: dict[str, Any]) -> None:
    for key, item in value.items():
        if type(item) is dict and item:
            _flatten(f"{prefix}{key}.", item, out)
        else:
            out[prefix + key] = item


def from_dicts(pd: Any, rows: list[Any]) -> Any:
    """A DataFrame of dicts (a row that is none has no values), its columns in the order
    first seen: the union of the keys is taken in C, not by pandas' Python loop."""
    rows = [row if type(row) is dict else {} for row in rows]
    names = list(dict.fromkeys(itertools.chain.from_iterable(rows)))
    return (
        pd.DataFrame.from_records(rows, columns=names)
        if names
        else pd.DataFrame(index=range(len(rows)))
    )


def _expand(pd: Any, rows: list[Any], prefix: str, *, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """Columns of `rows` (dicts, or anything else where a row has none): nested objects
    become dotted columns, identities are parsed, `skip` is left out. pandas builds each
    level in C: a Python loop over every field of 100,000 records would take seconds."""
    frame = from_dicts(pd, rows)
    columns: dict[str, Any] = {}
    for name in frame.columns:
        if name in skip:
            continue
        column = frame[name]
        if not prefix and name in IDENTITIES:
            parsed: dict[str, Any] = {}
            column = pd.Series(
                [_identity(name, value, parsed) for value in column.tolist()], dtype=object
            )
        # infer_dtype runs in C: only a column of mixed types can hold objects.
        if column.dtype == object and pd.api.types.infer_dtype(column).startswith("mixed"):
            values = column.tolist()
            if any(type(v) is dict and v for v in values):
                plain = [None if type(v) is dict else v for v in values]
                if any(v is not None for v in plain):
                    columns[prefix + name] = plain  # a string identity that is no JSON
                columns.update(_expand(pd, values, f"{prefix}{name}."))
                continue
        columns[prefix + name] = column.to_numpy()
    return columns


def _identity(name: str, value: Any, parsed: dict[str, Any]) -> Any:
    """An identity as an object (parsed once per distinct value): schema 2's object as
    written; schema 1's string as the configuration reads it into that same object, or,
    where that fails, by `parse_identity`; else the string itself."""
    if not isinstance(value, str):
        return value
    known = parsed.get(value)
    if known is None:
        known = parsed[value] = _parse_identity(name, value) or value
    return known


def _parse_identity(name: str, value: str) -> dict[str, Any] | None:
    try:
        from pytest_haico.config import identity

        parse = (
            identity.parse_model_identity
            if name == "model_identity"
            else identity.parse_backend_identity
        )
        fields = parse(value)
    except (ImportError, AttributeError, ValueError, TypeError, KeyError):
        fields = None
    if isinstance(fields, dict) and fields.get("kind") != "unknown":
        return fields
    return parse_identity(value)


def _turn_sums(pd: Any, turns: list[Any], n: int) -> dict[str, Any]:
    """`n_turns` and the per-record sums of the turns' figures (as `summarize_turns`)."""
    import numpy

    lengths = [len(t) if type(t) is list else 0 for t in turns]
    flat = [turn for t in turns if type(t) is list for turn in t if type(turn) is dict]
    columns: dict[str, Any] = {"n_turns": lengths}
    frame = from_dicts(pd, flat)
    owner = numpy.repeat(numpy.arange(n), lengths)
    if len(owner) != len(flat):  # a turn that is no object: count turn by turn
        owner = numpy.array(
            [i for i, t in enumerate(turns) if type(t) is list for u in t if type(u) is dict],
            dtype=int,
        )
    for key in TURN_SUMS:
        if key in frame:
            numbers = pd.to_numeric(frame[key], errors="coerce").to_numpy(dtype=float)
            known = ~numpy.isnan(numbers)
            sums = numpy.bincount(owner, weights=numpy.where(known, numbers, 0.0), minlength=n)
            sums[numpy.bincount(owner, weights=known, minlength=n) == 0] = numpy.nan
            columns[f"turns.{key}"] = sums
        else:
            columns[f"turns.{key}"] = numpy.full(n, numpy.nan)
    failed = [0] * n
    if "expectations" in frame:
        for index, results in zip(owner.tolist(), frame["expectations"].tolist(), strict=True):
            if isinstance(results, list):
                failed[index] += sum(1 for result in results if expectation_failed(result))
    columns["turns.expectations_failed"] = failed
    return columns


def records_frame(results: Results, *, newest: bool = False) -> pandas.DataFrame:
    """One row per record (per item with `newest`); see `pytest_haico.results`."""
    pd = require("pandas", "analysis", "Results.frame()")
    with paused_gc():
        frame: pandas.DataFrame = _records_frame(pd, results, newest=newest)
        return frame


def _records_frame(pd: Any, results: Results, *, newest: bool) -> Any:
    latest = {id(record) for record in results.newest()}
    chosen: list[Record] = []
    kinds: list[str] = []
    for record, kind in zip(results.records, results.attempt_kinds(), strict=True):
        if not newest or id(record) in latest:
            chosen.append(record)
            kinds.append(kind)
    n = len(chosen)
    data = [record.data for record in chosen]
    columns = _expand(pd, data, "", skip=("turns",))
    turn_sums = _turn_sums(pd, [record.get("turns") for record in data], n)
    paths: dict[int, str] = {}
    columns["newest"] = [id(record) in latest for record in chosen]
    columns["retry"] = [kind == RETRY for kind in kinds]
    columns["rerun"] = [kind == RERUN for kind in kinds]
    columns["ledger"] = [
        paths.get(id(r.path)) or paths.setdefault(id(r.path), str(r.path)) for r in chosen
    ]
    columns["line"] = [record.line for record in chosen]
    transcripts: dict[int, str] = {}  # per arm directory, its transcripts' directory
    columns["transcript"] = [
        (
            transcripts.get(id(r.arm_dir))
            or transcripts.setdefault(id(r.arm_dir), str(ArmPaths(r.arm_dir).transcripts_dir))
        )
        + "/"
        + transcript_name(r.data["item_id"], r.data["run_id"], r.data["attempt"])
        for r in chosen
    ]
    first = {key: columns.pop(key) for key in FIRST if key in columns}
    ordered = first | turn_sums | columns
    frame = pd.DataFrame(ordered)
    for column in ("started_at", "finished_at"):
        if column in frame:
            frame[column] = pd.to_datetime(frame[column], utc=True, format="ISO8601")
    return frame


def turns_frame(results: Results, *, newest: bool = False) -> pandas.DataFrame:
    """One row per turn of each record (of each item's newest with `newest`)."""
    pd = require("pandas", "analysis", "Results.turns_frame()")
    with paused_gc():
        frame: pandas.DataFrame = _turns_frame(pd, results, newest=newest)
        return frame


def _turns_frame(pd: Any, results: Results, *, newest: bool) -> Any:
    records: list[Record] = results.newest() if newest else results.records
    rows = []
    for record in records:
        base = {key: record.data.get(key) for key in _RECORD_KEYS}
        base["arm"] = record.arm
        base["stratum"] = record.data.get("stratum")
        for turn in record.turns:
            row = dict(base)
            for key, value in turn.items():
                if key == "expectations" and isinstance(value, list):
                    row["expectations"] = value
                    row["expectations_failed"] = sum(map(expectation_failed, value))
                elif type(value) is dict:
                    _flatten(key + ".", value, row)
                else:
                    row[key] = value
            rows.append(row)
    return pd.DataFrame.from_records(rows)
