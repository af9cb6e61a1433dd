"""The ledger: a durable one-line-per-attempt append, and a reader that survives kills."""

from __future__ import annotations

import errno
import json
import os
import re
import stat
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_haico.errors import LedgerWriteError, ResultsError
from pytest_haico.files import (
    DEFAULT_FILE_MODE,
    describe_filesystem,
    ends_inside_a_line,
    make_dirs,
    open_for_append,
    write_all,
)
from pytest_haico.ledger.records import (
    READABLE_SCHEMAS_PATTERN,
    SCHEMA_VERSION,
    LedgerRecord,
    is_readable_schema,
)

Warn = Callable[[str], None]


class LedgerWriter:
    """Appends records to one run's ledger file: one `write` per line, then fsync.

    Thread-safe: the runner writes from a worker thread while pytest's report hooks
    write from the main thread.
    """

    def __init__(self, path: Path, *, file_mode: int = DEFAULT_FILE_MODE) -> None:
        self.path = path
        self.file_mode = file_mode
        self._lock = threading.Lock()
        self._fd: int | None = None
        # Whether the file may end inside a line (a killed writer's, or a failed write
        # of ours): then the next line starts with a newline of its own.
        self._check_tail = True

    def append(self, record: LedgerRecord) -> None:
        """Write the record as one line and make it durable before returning.

        Raises `LedgerWriteError` (naming the file, its file system and the OS error)
        when the line may not be on disk; the next append starts on a fresh line,
        whatever part of this one reached the file.
        """
        line = record.to_line()
        with self._lock:
            try:
                fd = self._open()
                fresh = self._check_tail and ends_inside_a_line(self.path)
                # Until the whole line is written: a partial write (ENOSPC) leaves a fragment.
                self._check_tail = True
                write_all(fd, b"\n" + line if fresh else line)
                self._check_tail = False
                os.fsync(fd)
            except OSError as exc:
                raise ledger_write_error(self.path, exc) from exc

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def _open(self) -> int:
        if self._fd is None:
            make_dirs(self.path.parent, self.file_mode)
            self._fd = open_for_append(self.path, mode=self.file_mode)
        return self._fd


_FIXES = {
    errno.ENOSPC: "free space on that file system",
    errno.EDQUOT: "free space within your quota on that file system",
    errno.EROFS: "make that file system writable",
    errno.EACCES: "make the ledger writable for this user",
    errno.EPERM: "make the ledger writable for this user",
}


def ledger_write_error(path: Path, exc: OSError) -> LedgerWriteError:
    """The error for a record that may not be durable: file, file system, OS error, fix."""
    fix = _FIXES.get(exc.errno or 0, "repair that file system")
    return LedgerWriteError(
        f"cannot make a record durable in the ledger {path}: [Errno {exc.errno}] "
        f"{exc.strerror} on {describe_filesystem(path)}. {fix.capitalize()}, or choose "
        "another results directory (--haico-results, CLUSTER_WORK), then rerun the same "
        "command: the items without a record run again"
    )


@dataclass(frozen=True)
class RawRecord:
    """A parsed ledger line and where it was read."""

    data: dict[str, Any]
    path: Path
    line: int


# The fields resume needs, in the order and compact form `LedgerRecord.to_line` writes
# them in every readable schema; they all precede the long `turns` and the fields schema 2
# added. A line of another shape takes the full parse.
_RESUME_FIELDS = re.compile(
    rb'\{"schema":(' + READABLE_SCHEMAS_PATTERN + rb"),"
    rb'.*?"item_id":"([0-9a-f]{64})",.*?"attempt":(\d+),'
    rb'.*?"verdict":"([a-z_]+)",.*?"finished_at":"([^"\\]*)",'
)

_RESUME_NEEDS = "resume needs every ledger of the arm, or it would run finished items again"


def iter_ledger(
    path: Path,
    *,
    warn: Warn,
    resume_fields: bool = False,
    consumed: Callable[[bytes], bool] | None = None,
) -> Iterator[RawRecord]:
    """Stream the valid records of one ledger file, warning about every line it skips.

    Never raises on content and never writes: a torn last line (a kill mid-write),
    garbage, a record of an unknown future schema are each skipped with a warning
    naming the file and the line; every schema in `READABLE_SCHEMAS` is yielded as
    written (a schema-1 record has no `tags`, `settings` or `expectations`, and string
    identities). A file that cannot be read at all (permissions, not
    a regular file, an I/O error) raises `ResultsError`: skipping it would rerun what it
    records. With `resume_fields`, a whole line as this package writes it yields only
    item_id, attempt, verdict and finished_at, read without a full JSON parse (7x faster
    on long records). `consumed` sees each whole line first: when it returns True the
    caller has read the line itself (a faster parse of its own) and it is not parsed here.
    """
    try:
        # Non-blocking: opening a FIFO for reading would wait for a writer for ever.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError as exc:
        if not path.is_symlink():
            return  # removed since it was listed
        problem = "it is a symbolic link to a missing file"
        raise _unreadable(path, problem, "restore its target, or remove the link") from exc
    except OSError as exc:
        raise _unreadable(path, _os_problem(exc), "make it readable for this user") from exc
    try:
        kind = _file_kind(os.fstat(fd).st_mode)
    except OSError:
        os.close(fd)
        raise
    if kind != "regular file":
        os.close(fd)
        problem = f"it is a {kind}, not a regular file"
        raise _unreadable(path, problem, f"move it out of {path.parent}")
    with os.fdopen(fd, "rb") as handle:
        try:
            yield from _iter_lines(
                handle, path, warn=warn, resume_fields=resume_fields, consumed=consumed
            )
        except OSError as exc:
            raise _unreadable(path, _os_problem(exc), "repair its file system") from exc


def _iter_lines(
    handle: Iterable[bytes],
    path: Path,
    *,
    warn: Warn,
    resume_fields: bool,
    consumed: Callable[[bytes], bool] | None,
) -> Iterator[RawRecord]:
    number = 0
    for raw in handle:
        number += 1
        if not raw.strip():
            continue
        torn = not raw.endswith(b"\n")
        if consumed is not None and not torn and consumed(raw):
            continue
        if resume_fields and not torn and raw.endswith(b"}\n"):
            fields = _RESUME_FIELDS.match(raw)
            if fields is not None:
                schema, item_id, attempt, verdict, finished_at = fields.groups()
                data = {
                    "schema": int(schema),
                    "item_id": item_id.decode(),
                    "attempt": int(attempt),
                    "verdict": verdict.decode(),
                    "finished_at": finished_at.decode(),
                }
                yield RawRecord(data=data, path=path, line=number)
                continue
        try:
            data = json.loads(raw)
        except ValueError:
            what = "a torn last line (a kill mid-write?)" if torn else "not valid JSON"
            warn(f"{path}:{number}: skipped {what}")
            continue
        if not isinstance(data, dict):
            warn(f"{path}:{number}: skipped, not a JSON object")
            continue
        schema = data.get("schema")
        if not is_readable_schema(schema):
            if type(schema) is int and schema > SCHEMA_VERSION:
                warn(
                    f"{path}:{number}: skipped a record of schema {schema}, newer than "
                    f"this pytest-haico reads ({SCHEMA_VERSION}); upgrade pytest-haico"
                )
            else:
                warn(f"{path}:{number}: skipped a record without a known schema ({schema!r})")
            continue
        yield RawRecord(data=data, path=path, line=number)


def iter_ledger_dir(
    directory: Path, *, warn: Warn, resume_fields: bool = False
) -> Iterator[RawRecord]:
    """Stream every `*.jsonl` ledger in `directory` (one file per run), in name order.

    A missing directory has no records; one that is not a directory, or cannot be
    listed, raises `ResultsError`.
    """
    try:
        with os.scandir(directory) as entries:
            names = sorted(entry.name for entry in entries if entry.name.endswith(".jsonl"))
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


def _unreadable(path: Path, problem: str, fix: str) -> ResultsError:
    return ResultsError(f"cannot read the ledger {path}: {problem}; {_RESUME_NEEDS}: {fix}")


def _os_problem(exc: OSError) -> str:
    return f"[Errno {exc.errno}] {exc.strerror}"


def _file_kind(mode: int) -> str:
    kinds = (
        (stat.S_ISREG, "regular file"),
        (stat.S_ISDIR, "directory"),
        (stat.S_ISFIFO, "FIFO"),
        (stat.S_ISSOCK, "socket"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
    )
    return next((name for test, name in kinds if test(mode)), "special file")
