"""The per-attempt transcript: a header line saying whose it is, then every backend event
as received, one redacted JSON line each."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import stat
import threading
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, BinaryIO

from pytest_haico.files import describe_write_failure, open_for_append
from pytest_haico.redact import Redactor

# Lines are handed to the writing side at most this often per transcript, so a
# turn's lines make one write job rather than one each (a job costs more than
# encoding its lines); a kill loses at most this much more of a transcript.
BATCH_S = 0.5

# The key that marks a transcript's first line as its header, and the header's version.
HEADER_KEY = "haico_transcript"
HEADER_VERSION = 1


def transcript_header(**fields: Any) -> dict[str, Any]:
    """A transcript's first line: `{"haico_transcript": 1, ...}` and what it belongs to
    (an item's transcript: item_id, run_id, attempt, arm, script, repeat, nodeid,
    thread_id, started_at). Readers of events skip it (`is_header`)."""
    return {HEADER_KEY: HEADER_VERSION, **fields}


def is_header(line: object) -> bool:
    """Whether a parsed transcript line is the header rather than an event."""
    return isinstance(line, dict) and HEADER_KEY in line


class TranscriptWriter:
    """Appends JSON lines to one transcript file, writing them off the event loop.

    ``append`` only queues the line. Within `BATCH_S` of the first queued line,
    the lines are written as one batch by a job in the running loop's default
    executor (threads shared by every transcript of the loop, rather than one
    thread per transcript); the job redacts, serialises, writes and flushes, so
    a kill loses little, and the file is fsynced once at ``aclose``. A write
    failure does not raise into the conversation: it is kept in ``error``.
    A ``header`` (see `transcript_header`) is the file's first line, redacted too.
    """

    def __init__(
        self, path: Path, *, redactor: Redactor, header: Mapping[str, Any] | None = None
    ) -> None:
        self.path = path
        self.error: BaseException | None = None
        self._redactor = redactor
        self._lock = threading.Lock()
        self._pending: list[tuple[float | None, dict[str, Any]]] = []  # guarded by _lock
        self._busy = False  # a job is queued or running; guarded by _lock
        self._timer = False  # a hand-over is scheduled on the loop; guarded by _lock
        self._closed = False  # guarded by _lock
        self._stream: BinaryIO | None = None  # touched by the one job at a time only
        self._opened = False
        self._finished: concurrent.futures.Future[None] = concurrent.futures.Future()
        if header is not None:
            self._pending.append((None, dict(header)))

    def failure(self) -> str | None:
        """What went wrong writing the file, in one line (a full disk names its file system
        and the fix); None when nothing did."""
        if isinstance(self.error, OSError):
            return describe_write_failure(
                "write the transcript", self.path, self.error, owner="transcript"
            )
        if self.error is not None:
            return f"writing the transcript {self.path} failed: {self.error}"
        return None

    def append(self, line: Mapping[str, Any], *, at: float | None = None) -> None:
        """Queue one line (a JSON object); never blocks.

        With ``at`` (a `time.time` value) the line starts with an ``"at"`` field,
        that moment in ISO 8601 UTC, formatted off the loop. Outside an event loop
        the lines wait for `close`.
        """
        with self._lock:
            if self._closed:
                raise RuntimeError(f"transcript {self.path} is closed")
            self._pending.append((at, dict(line)))
            if self._busy or self._timer:
                return  # the job under way, or the one the timer starts, writes it
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                return
            self._timer = True
        loop.call_later(BATCH_S, self._hand_over, loop)

    async def aclose(self) -> None:
        """Write what is queued, fsync and close the file, waiting off the loop.

        The close is handed to the writing side before the wait, so even if the
        waiting task is cancelled again the file is still finished.
        """
        if self._start_close():
            _start_job(asyncio.get_running_loop(), self._write_pending)
        await asyncio.shield(asyncio.wrap_future(self._finished))

    def close(self) -> None:
        """The blocking variant of `aclose`, for callers outside an event loop."""
        if self._start_close():
            self._write_pending()
        self._finished.result()

    def _hand_over(self, loop: asyncio.AbstractEventLoop) -> None:
        with self._lock:
            self._timer = False
            if self._busy or self._closed or not self._pending:
                return  # the job under way, or the closing one, writes them
            self._busy = True
        _start_job(loop, self._write_pending)

    def _start_close(self) -> bool:
        """Mark the transcript closed; True when the caller must start the final job."""
        with self._lock:
            if self._closed:
                return False
            self._closed = True
            if self._busy:
                return False  # the job under way finishes the file
            self._busy = True
            return True

    def _write_pending(self) -> None:
        """The one job at a time: write batches until none is left, then finish if closed."""
        while True:
            with self._lock:
                batch, self._pending = self._pending, []
                if not batch:
                    self._busy = False
                    closing = self._closed
                    break
            self._write(batch)
        if closing:
            self._finish()

    def _write(self, batch: list[tuple[float | None, dict[str, Any]]]) -> None:
        if not self._opened:
            self._opened = True
            try:
                self._stream = _open_for_append(self.path)
            except Exception as exc:
                self.error = exc
        if self._stream is None:
            return  # the file could not be opened; the lines are dropped
        chunks = []
        for at, line in batch:
            try:
                chunks.append(self._encode(at, line))
            except Exception as exc:  # a line that cannot be encoded is lost alone
                self.error = self.error or exc
        try:
            self._stream.write(b"".join(chunks))
            self._stream.flush()
        except Exception as exc:
            self.error = self.error or exc

    def _finish(self) -> None:
        if not self._opened:
            self._write([])  # an empty transcript still gets its file
        stream = self._stream
        if stream is not None:
            try:
                os.fsync(stream.fileno())
            except Exception as exc:
                self.error = self.error or exc
            try:
                stream.close()
            except Exception as exc:
                self.error = self.error or exc
        self._finished.set_result(None)

    def _encode(self, at: float | None, line: dict[str, Any]) -> bytes:
        if at is not None:
            line = {"at": datetime.fromtimestamp(at, UTC).isoformat(), **line}
        return self._redactor.dumps(line).encode() + b"\n"


def _open_for_append(path: Path) -> BinaryIO:
    """Open the transcript for appending. A new one gets the read and write bits of its
    directory whatever the umask: the campaign made that directory with the results mode
    (0750 gives 0640), and nobody but the owner may write it either way."""
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = stat.S_IMODE(path.parent.stat().st_mode) & 0o644
    return os.fdopen(open_for_append(path, mode=mode), "ab")


def _start_job(loop: asyncio.AbstractEventLoop, job: Callable[[], None]) -> None:
    try:
        loop.run_in_executor(None, job)
    except RuntimeError:
        # The loop's executor is shut down (the loop is ending): a thread of its own.
        threading.Thread(target=job, name="haico-transcript", daemon=True).start()
