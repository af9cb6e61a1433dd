"""A service's log file as messages quote it: its tail, and the last line it wrote."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from pytest_haico.redact import Redactor

_TAIL_BYTES = 8192
_TAIL_LINES = 25
_PROGRESS_CHARS = 300  # a progress line stays one line of the session's output
LOG_HEADER = "--- pytest-haico "  # how our own lines in a service's log begin


def read_log_tail(path: Path, *, offset: int = 0, secrets: Iterable[str] = ()) -> str:
    """The last lines of a log file from `offset` on, redacted and indented for a message."""
    try:
        with path.open("rb") as log:
            size = log.seek(0, os.SEEK_END)
            log.seek(max(offset, size - _TAIL_BYTES))
            text = log.read().decode("utf-8", "replace")
    except OSError as exc:
        return f"    (log unreadable: {exc})"
    lines = Redactor(secrets).redact(text).splitlines()[-_TAIL_LINES:] or ["(empty)"]
    return "\n".join(f"    {line}" for line in lines)


def read_last_log_line(path: Path, *, offset: int = 0, secrets: Iterable[str] = ()) -> str | None:
    """The last non-empty line a service wrote to its log from `offset` on, redacted and cut
    to one short line; None if it wrote nothing yet.

    A carriage return ends a line too: progress bars (tqdm) redraw one line with it.
    """
    try:
        with path.open("rb") as log:
            size = log.seek(0, os.SEEK_END)
            log.seek(max(offset, size - _TAIL_BYTES))
            text = log.read().decode("utf-8", "replace")
    except OSError:
        return None
    for line in reversed(text.replace("\r", "\n").split("\n")):
        line = line.strip()
        if line and not line.startswith(LOG_HEADER):
            line = Redactor(secrets).redact(line)
            return line if len(line) <= _PROGRESS_CHARS else line[: _PROGRESS_CHARS - 1] + "…"
    return None
