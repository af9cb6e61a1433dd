"""The pure SSE parser: chunks of an event stream in, the data of each complete event out.

It follows the WHATWG event-stream rules the driver needs: lines end in CRLF,
LF or CR (also when a chunk boundary splits a CRLF); ``data`` lines of one event
are joined with newlines; a blank line dispatches the event, and only an event
that had a ``data`` line; comments and the ``event``, ``id`` and ``retry`` fields
are ignored; an event cut off by the end of the stream is dropped. Text is
UTF-8 (undecodable bytes become U+FFFD) with one leading BOM ignored. Lines are
split on bytes, so a multi-byte character split across chunks stays whole.
"""

from __future__ import annotations

_BOM = "\ufeff".encode()


class SSEDecoder:
    """Turns an event stream, fed in chunks of bytes, into the data of its events."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []  # the unfinished last line, in pieces (no quadratic +=)
        self._skip_lf = False  # the last chunk ended in a CR: an LF next is its CRLF's
        self._data: list[bytes] | None = None  # the data lines of the event being read
        self._first_line = True

    def feed(self, chunk: bytes) -> list[str]:
        """The data of every event this chunk completes, in order.

        An event cut off by the end of the stream is never returned.
        """
        if self._skip_lf and chunk:
            self._skip_lf = False
            if chunk.startswith(b"\n"):
                chunk = chunk[1:]
        if b"\n" not in chunk and b"\r" not in chunk:
            if chunk:
                self._parts.append(chunk)
            return []
        if self._parts:
            chunk = b"".join((*self._parts, chunk))
        if b"\r" in chunk:
            self._skip_lf = chunk.endswith(b"\r")
            chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        lines = chunk.split(b"\n")
        last = lines.pop()
        self._parts = [last] if last else []
        if self._first_line:
            self._first_line = False
            if lines[0].startswith(_BOM):
                lines[0] = lines[0][len(_BOM) :]
        return self._lines(lines)

    def _lines(self, lines: list[bytes]) -> list[str]:
        events: list[str] = []
        for line in lines:
            if not line:
                if self._data is not None:
                    events.append(b"\n".join(self._data).decode("utf-8", "replace"))
                    self._data = None
                continue
            if not line.startswith(b"data"):
                continue  # a comment, or a field the driver does not use
            name, colon, value = line.partition(b":")
            if name != b"data":
                continue  # "datum: ..." and the like
            if colon and value.startswith(b" "):
                value = value[1:]
            if self._data is None:
                self._data = [value]
            else:
                self._data.append(value)
        return events
