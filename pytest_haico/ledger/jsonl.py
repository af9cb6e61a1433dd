"""The ledger writer: a durable one-line-per-attempt append that survives kills."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from pytest_haico.errors import LedgerWriteError
from pytest_haico.files import (
    DEFAULT_FILE_MODE,
    describe_write_failure,
    ends_inside_a_line,
    make_dirs,
    open_for_append,
    write_all,
)
from pytest_haico.ledger.records import LedgerRecord, record_line


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
        line = record_line(record)
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


def ledger_write_error(path: Path, exc: OSError) -> LedgerWriteError:
    """The error for a record that may not be durable: file, file system, OS error, fix."""
    return LedgerWriteError(
        describe_write_failure("make a record durable in the ledger", path, exc, owner="ledger")
    )
