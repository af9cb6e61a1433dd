"""The ledger's line format: the schema versions, the order of a line's leading fields, and
the tolerant reader that every ledger reader reads through.

A record is one line: its compact JSON (`records.record_line`), `schema` first, then the leading
fields in `LEADING_FIELDS`' order, then the rest. Those leading fields keep their order
and compact form in every schema: the fast readers (resume, `haico cost`) match them
without a JSON parse (`leading_fields_pattern`); a new field goes after them.

Schema 2 (written now) adds to schema 1, after the leading fields:

* `model_identity` and `backend_identity` are JSON objects with a `kind` (`standin`,
  `path`, `hf`, `endpoint`; `standin`, `image`, `cmd`; or `unspecified`) and that
  kind's fields; schema 1 wrote them as strings (`config.identity.parse_*_identity`
  turns such a string into the same object);
* `tags`: the script's tags; `settings`: the arm's resolved `model`, `vllm`,
  `generation` and `agent` sections, as the item's identity hashes them;
* each turn's `expectations`: every expectation checked on the turn, passed or not,
  with what was seen. A `judge` expectation (added within schema 2, an optional key
  written on judge expectations only, so no other line changes) also holds `judge`: who
  answered (`name`, `served_name`, `model` as `model_identity`'s object, `vllm_version`,
  `job_id`) and its `answer`; a schema-2 reader that does not know it reads the rest.

How the version moves: every change to the set, the types or the meaning of the
fields gets the next version, and readers are changed in the same release to read it.
A reader reads every version up to its own (`READABLE_SCHEMAS`): a field that an older
record lacks reads as missing, schema 1's identities as strings. A record of a higher
version is skipped with a warning naming the file and line (upgrade pytest-haico),
never guessed at: its fields may mean something else. Nothing ever rewrites a ledger.

Imports neither pydantic nor the record model: the results API reads through it.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

from pytest_haico.errors import ResultsError
from pytest_haico.files import file_kind
from pytest_haico.ledger.damage import damaged_field
from pytest_haico.ledger.layout import is_ledger_name

Warn = Callable[[str], None]

SCHEMA_VERSION = 2
# The versions readers of this package read (every one up to SCHEMA_VERSION).
READABLE_SCHEMAS = frozenset(range(1, SCHEMA_VERSION + 1))

# The fields every line starts with, in this order, and how each value is written.
LEADING_FIELDS: tuple[tuple[str, str], ...] = (
    ("schema", "int"),
    ("run_id", "str"),
    ("campaign", "str"),
    ("arm", "str"),
    ("stratum", "str"),
    ("item_id", "str"),
    ("nodeid", "str"),
    ("script", "str"),
    ("script_sha256", "str"),
    ("repeat", "int"),
    ("attempt", "int"),
    ("outcome", "str"),
    ("verdict", "str"),
    ("started_at", "str"),
    ("finished_at", "str"),
    ("duration_s", "number"),
)

# A value as written, passed over; and captured, a string only when it holds no escape
# (its bytes are then its value).
# An int or a number of more digits than any real one is left to the JSON parse.
_PASSED_OVER = {
    "int": rb"-?\d{1,18}",
    "str": rb'"[^"\\]*(?:\\.[^"\\]*)*"',
    "number": rb"(?:-?\d[\d.eE+-]{0,31}|null)",
}
_CAPTURED = {
    "int": rb"(-?\d{1,18})",
    "str": rb'"([^"\\]*)"',
    "number": rb"(-?\d[\d.eE+-]{0,31}|null)",
}
_SCHEMAS_PATTERN = b"|".join(b"%d" % schema for schema in sorted(READABLE_SCHEMAS))


def is_readable_schema(value: object) -> bool:
    """Whether a record's `schema` value is one this package reads (`true` is no 1)."""
    return type(value) is int and value in READABLE_SCHEMAS


def leading_fields_pattern(*names: str) -> re.Pattern[bytes]:
    """A pattern matching a line's leading fields up to the last of `names`, with a group
    per name in line order holding its value as written; the schema must be a readable
    one. A line it does not match is left to the JSON parse."""
    order = [name for name, _ in LEADING_FIELDS]
    parts = []
    for name, kind in LEADING_FIELDS[: max(map(order.index, names)) + 1]:
        if name == "schema":
            value = (b"(%s)" if name in names else b"(?:%s)") % _SCHEMAS_PATTERN
        else:
            value = (_CAPTURED if name in names else _PASSED_OVER)[kind]
        parts.append(b'"%s":%s,' % (name.encode(), value))
    return re.compile(rb"\{" + b"".join(parts))


_loads: Callable[[bytes], Any]
try:  # 4-5x faster on long records; in the `analysis` and `report` extras
    from orjson import loads as _loads
except ImportError:  # pragma: no cover - depends on the installed extras
    _loads = json.loads


class RawRecord(NamedTuple):
    """A parsed ledger line and where it was read."""

    data: dict[str, Any]
    path: Path
    line: int


_RESUME_NEEDS = "resume needs every ledger of the arm, or it would run finished items again"


class UnreadableLedgerError(ResultsError):
    """A ledger file cannot be read at all (permissions, not a regular file, an I/O error):
    skipping it would rerun what it records. `problem` says why, `fix` what to do;
    `regular` is False for a path that is no regular file (the results API skips it)."""

    def __init__(self, path: Path, problem: str, fix: str, *, regular: bool = True) -> None:
        self.path = path
        self.problem = problem
        self.fix = fix
        self.regular = regular
        super().__init__(f"cannot read the ledger {path}: {problem}; {_RESUME_NEEDS}: {fix}")


_BUFFER_BYTES = 1 << 20
# The fields resume decides on.
_RESUME_FIELDS = leading_fields_pattern(
    "schema", "item_id", "repeat", "attempt", "verdict", "finished_at", "duration_s"
)


def iter_ledger(
    path: Path,
    *,
    warn: Warn,
    resume_fields: bool = False,
    consumed: Callable[[bytes], bool] | None = None,
) -> Iterator[RawRecord]:
    """Stream the valid records of one ledger file, warning about every line it skips.

    Never raises on content and never writes: a torn last line (a kill mid-write),
    garbage, a record of an unknown future schema, a damaged record (`damaged_field`)
    are each skipped with a warning naming the file and the line; every schema in
    `READABLE_SCHEMAS` is yielded as written (a schema-1 record has no `tags`,
    `settings` or `expectations`, and string identities). Lines are parsed with orjson
    when it is installed; a line it refuses (NaN, a lone surrogate) goes to json, so
    what is read never depends on the extras.
    A file that cannot be read at all raises `UnreadableLedgerError`; one removed since
    it was listed has no records.

    Two fast paths see a whole line ending in `}` first. With `resume_fields`, a line
    `_RESUME_FIELDS` matches, with a repeat and duration_s `sound_leading` passes,
    yields only schema, item_id, attempt, verdict and finished_at (7x faster than a
    parse on long records). `consumed` sees it before: when it returns True the caller
    has read the line itself and it is not parsed here; it must take only lines whose
    repeat and duration_s `sound_leading` passes, so that it skips what the parse does.
    """
    try:
        # Non-blocking: opening a FIFO for reading would wait for a writer for ever.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError as exc:
        if not path.is_symlink():
            return
        problem = "it is a symbolic link to a missing file"
        raise UnreadableLedgerError(
            path, problem, "restore its target, or remove the link"
        ) from exc
    except OSError as exc:
        raise UnreadableLedgerError(
            path, _os_problem(exc), "make it readable for this user"
        ) from exc
    try:
        kind = file_kind(os.fstat(fd).st_mode)
    except OSError:
        os.close(fd)
        raise
    if kind != "regular file":
        os.close(fd)
        problem = f"it is a {kind}, not a regular file"
        raise UnreadableLedgerError(path, problem, f"move it out of {path.parent}", regular=False)
    # Records are a few kB long: a small buffer would be refilled for nearly every line.
    with os.fdopen(fd, "rb", buffering=_BUFFER_BYTES) as handle:
        try:
            yield from _iter_records(
                handle, path, warn=warn, resume_fields=resume_fields, consumed=consumed
            )
        except OSError as exc:
            raise UnreadableLedgerError(path, _os_problem(exc), "repair its file system") from exc


def _iter_records(
    handle: Iterable[bytes],
    path: Path,
    *,
    warn: Warn,
    resume_fields: bool,
    consumed: Callable[[bytes], bool] | None,
) -> Iterator[RawRecord]:
    loads = _loads
    fast = resume_fields or consumed is not None
    for number, raw in enumerate(handle, 1):
        if fast and raw.endswith(b"}\n"):
            if consumed is not None and consumed(raw):
                continue
            fields = _RESUME_FIELDS.match(raw) if resume_fields else None
            if fields is not None and sound_leading(fields[3], fields[7]):
                schema, item_id, _, attempt, verdict, finished_at, _ = fields.groups()
                data = {
                    "schema": int(schema),
                    "item_id": item_id.decode(),
                    "attempt": int(attempt),
                    "verdict": verdict.decode(),
                    "finished_at": finished_at.decode(),
                }
                yield RawRecord(data, path, number)
                continue
        try:
            data = loads(raw)
        except ValueError:
            try:
                data = json.loads(raw)
            except ValueError:
                if raw.strip():
                    torn = not raw.endswith(b"\n")
                    what = "a torn last line (a kill mid-write?)" if torn else "not valid JSON"
                    warn(f"{path}:{number}: skipped {what}")
                continue
        if type(data) is not dict:
            warn(f"{path}:{number}: skipped, not a JSON object")
            continue
        schema = data.get("schema")
        if type(schema) is not int or schema not in READABLE_SCHEMAS:
            warn(f"{path}:{number}: skipped {_unknown_schema(schema)}")
            continue
        if (problem := damaged_field(data)) is not None:
            warn(f"{path}:{number}: skipped a damaged record: {problem}")
            continue
        yield RawRecord(data, path, number)


# The fast paths check the fields of `damaged_field` that lead a line (stratum and script
# match as strings; repeat and duration_s by `sound_leading`), not the turns: any test of
# the turns costs as much as the parse the fast paths save (a regex over a 2 kB line
# takes longer than orjson's parse of it).
def sound_leading(repeat: bytes, duration: bytes) -> bool:
    """Whether `damaged_field` passes a line's leading repeat and duration_s as written
    (as `leading_fields_pattern` captures them); a fast path takes no other line."""
    if repeat.startswith(b"-"):
        return False
    if duration == b"null":
        return True
    try:
        return 0 <= float(duration) < math.inf  # False for NaN
    except ValueError:  # not a JSON number: the parse says what it is
        return False


def _unknown_schema(schema: object) -> str:
    if type(schema) is int and schema > SCHEMA_VERSION:
        return (
            f"a record of schema {schema}, newer than this pytest-haico reads "
            f"({SCHEMA_VERSION}); upgrade pytest-haico"
        )
    return f"a record without a known schema ({schema!r})"


def iter_ledger_dir(
    directory: Path, *, warn: Warn, resume_fields: bool = False
) -> Iterator[RawRecord]:
    """Stream every `*.jsonl` ledger in `directory` (one file per run), in name order.

    A missing directory has no records; one that is not a directory, or cannot be
    listed, raises `ResultsError`.
    """
    try:
        with os.scandir(directory) as entries:
            names = sorted(entry.name for entry in entries if is_ledger_name(entry.name))
    except FileNotFoundError:
        return
    except NotADirectoryError:
        raise ResultsError(
            f"the ledger directory {directory} is not a directory; {_RESUME_NEEDS}: move it "
            "aside (the ledger directory holds one <run_id>.jsonl per run), then rerun"
        ) from None
    except OSError as exc:
        raise ResultsError(
            f"cannot list the ledger directory {directory}: {_os_problem(exc)}; "
            f"{_RESUME_NEEDS}: make it readable for this user"
        ) from exc
    for name in names:
        yield from iter_ledger(directory / name, warn=warn, resume_fields=resume_fields)


def _os_problem(exc: OSError) -> str:
    return f"[Errno {exc.errno}] {exc.strerror}"
