"""Turns reuse the client's connection: each stream is read to its end, over real sockets."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest

from pytest_haico.driver import conversation as driver
from pytest_haico.driver.conversation import ConversationSetup, run_conversation
from pytest_haico.driver.result import ConversationResult
from pytest_haico.ledger.verdicts import Verdict
from tests.driver.driver_fakes import (
    ENDPOINT,
    THREAD,
    TOKEN,
    FakeSnapshots,
    answer,
    make_arm,
    make_script,
)

pytestmark = pytest.mark.asyncio


class _Backend:
    """An HTTP/1.1 server answering every request with one turn's events; counts connections."""

    def __init__(self, framing: str) -> None:
        self.framing = framing  # "length", "chunked", or "open" (chunked, never ended)
        self.connections = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(line.partition(b":")[2])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                )
                json.loads(await reader.readexactly(length))
                writer.write(self._response(b"".join(answer())))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the client closed the connection
        finally:
            writer.close()

    def _response(self, events: bytes) -> bytes:
        head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
        if self.framing == "length":
            return head + b"content-length: %d\r\n\r\n" % len(events) + events
        chunk = b"%x\r\n%s\r\n" % (len(events), events)
        end = b"" if self.framing == "open" else b"0\r\n\r\n"
        return head + b"transfer-encoding: chunked\r\n\r\n" + chunk + end


async def _converse(backend: _Backend, tmp_path: Path, turns: int) -> ConversationResult:
    server = await asyncio.start_server(backend.serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with server, httpx.AsyncClient(trust_env=False) as client:
            setup = ConversationSetup(
                backend_url=f"http://127.0.0.1:{port}",
                token=TOKEN,
                endpoint_url=ENDPOINT,
                arm=make_arm(),
                snapshots=FakeSnapshots(),
                snapshot_wait_s=0.0,
            )
            return await run_conversation(
                client,
                setup,
                script=make_script(*(f"turn {i}" for i in range(turns))),
                thread_id=THREAD,
                transcript_path=tmp_path / "t.jsonl",
            )
    finally:
        server.close()


@pytest.mark.parametrize("framing", ["length", "chunked"])
async def test_every_turn_of_a_conversation_uses_one_connection(
    framing: str, tmp_path: Path
) -> None:
    backend = _Backend(framing)
    result = await _converse(backend, tmp_path, turns=3)
    assert result.verdict is Verdict.COMPLETED
    assert backend.connections == 1


async def test_a_stream_left_open_is_given_up_after_the_grace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(driver, "_DRAIN_GRACE_S", 0.05)
    backend = _Backend("open")
    result = await _converse(backend, tmp_path, turns=2)
    assert result.verdict is Verdict.COMPLETED
    assert backend.connections == 2  # the open stream's connection could not be reused
