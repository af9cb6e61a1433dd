"""The per-attempt transcript: every backend event as received, one redacted JSON line each."""

from __future__ import annotations

import asyncio
import json
import os
import queue
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any, BinaryIO, Final

from pytest_haico.redact import Redactor

_CLOSE: Final = object()


def transcript_path(arm_dir: Path, *, item_id: str, run_id: str, attempt: int) -> Path:
    """``<arm dir>/transcripts/<item_id>.<run_id>.<attempt>.jsonl``."""
    return arm_dir / "transcripts" / f"{item_id}.{run_id}.{attempt}.jsonl"


class TranscriptWriter:
    """Appends JSON lines to one transcript file from a thread of its own.

    ``append`` only enqueues, so the event loop never waits on the shared file
    system; the thread redacts, serialises and writes, flushes whenever it has
    caught up (a kill loses little), and fsyncs once at ``aclose``. A write
    failure does not raise into the conversation: it is kept in ``error``.
    """

    def __init__(self, path: Path, *, redactor: Redactor) -> None:
        self.path = path
        self.error: BaseException | None = None
        self._redactor = redactor
        self._queue: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._closed = False
        # A daemon thread, so a stuck write on a hung mount cannot keep the
        # process alive past an emergency exit; normal ends always close it.
        self._thread = threading.Thread(
            target=self._run, name=f"haico-transcript-{path.name}", daemon=True
        )
        self._thread.start()

    def append(self, line: Mapping[str, Any]) -> None:
        """Queue one line (a JSON object); never blocks."""
        if self._closed:
            raise RuntimeError(f"transcript {self.path} is closed")
        self._queue.put(dict(line))

    async def aclose(self) -> None:
        """Flush, fsync and close the file, waiting off the loop.

        The close is queued before the wait, so even if the waiting task is
        cancelled again the thread still finishes the file.
        """
        if not self._closed:
            self._closed = True
            self._queue.put(_CLOSE)
        if self._thread.is_alive():
            await asyncio.shield(asyncio.to_thread(self._thread.join))

    def close(self) -> None:
        """The blocking variant of `aclose`, for callers outside an event loop."""
        if not self._closed:
            self._closed = True
            self._queue.put(_CLOSE)
        self._thread.join()

    def _run(self) -> None:
        stream: BinaryIO | None = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            stream = self.path.open("ab")
        except Exception as exc:
            self.error = exc
        while True:
            item = self._queue.get()
            if item is _CLOSE:
                break
            if stream is None:
                continue  # the file could not be opened; drain so close() returns
            try:
                stream.write(self._encode(item))
                if self._queue.empty():
                    stream.flush()
            except Exception as exc:
                self.error = self.error or exc
        if stream is not None:
            try:
                stream.flush()
                os.fsync(stream.fileno())
            except Exception as exc:
                self.error = self.error or exc
            finally:
                stream.close()

    def _encode(self, item: object) -> bytes:
        text = json.dumps(
            self._redactor.redact_json(item), ensure_ascii=False, separators=(",", ":"), default=str
        )
        return text.encode() + b"\n"
