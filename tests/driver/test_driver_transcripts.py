"""The transcript writer: ordered lines, written off the event loop, closed and redacted."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any

import pytest

from pytest_haico.driver import transcripts
from pytest_haico.driver.transcripts import TranscriptWriter
from pytest_haico.ledger.layout import ArmPaths
from pytest_haico.redact import Redactor


def test_transcript_path_follows_the_results_layout(tmp_path: Path) -> None:
    path = ArmPaths(tmp_path / "qwen32b").transcript("abc", "123_4.0", 2)
    assert path == tmp_path / "qwen32b" / "transcripts" / "abc.123_4.0.2.jsonl"


@pytest.mark.asyncio
async def test_lines_are_written_in_order_and_redacted(tmp_path: Path) -> None:
    writer = TranscriptWriter(tmp_path / "t" / "x.jsonl", redactor=Redactor(["hunter2"]))
    for n in range(500):
        writer.append({"n": n, "text": "pw hunter2"})
    await writer.aclose()
    lines = [json.loads(line) for line in writer.path.read_text().splitlines()]
    assert [line["n"] for line in lines] == list(range(500))
    assert lines[0]["text"] == "pw [REDACTED]"
    assert writer.error is None
    with pytest.raises(RuntimeError, match="closed"):
        writer.append({"late": True})


@pytest.mark.asyncio
async def test_append_does_not_wait_for_the_writer(tmp_path: Path) -> None:
    release = threading.Event()

    class SlowStorage(Redactor):
        def dumps(self, value: Any) -> str:
            release.wait(5)  # stands in for a write stalled on a shared file system
            return super().dumps(value)

    writer = TranscriptWriter(tmp_path / "x.jsonl", redactor=SlowStorage())
    writer.append({"n": 1})
    writer.append({"n": 2})
    ticks = 0
    for _ in range(3):  # the loop keeps running while the writer is stuck
        await asyncio.sleep(0)
        ticks += 1
    assert ticks == 3
    assert not writer.path.exists() or not writer.path.read_bytes()
    release.set()
    await writer.aclose()
    assert len(writer.path.read_text().splitlines()) == 2


@pytest.mark.asyncio
async def test_open_failure_is_kept_not_raised(tmp_path: Path) -> None:
    (tmp_path / "blocker").write_text("")
    writer = TranscriptWriter(tmp_path / "blocker" / "x.jsonl", redactor=Redactor())
    writer.append({"n": 1})
    await writer.aclose()
    assert isinstance(writer.error, OSError)


def test_close_without_a_loop(tmp_path: Path) -> None:
    writer = TranscriptWriter(tmp_path / "x.jsonl", redactor=Redactor())
    writer.append({"n": 1})
    writer.close()
    writer.close()
    assert writer.path.read_text() == '{"n":1}\n'


@pytest.mark.asyncio
async def test_lines_are_written_in_batches_before_the_close(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(transcripts, "BATCH_S", 0.01)
    writer = TranscriptWriter(tmp_path / "x.jsonl", redactor=Redactor())
    writer.append({"n": 1})
    writer.append({"n": 2})
    for _ in range(200):  # a kill now loses nothing of the two lines
        await asyncio.sleep(0.01)
        if writer.path.exists() and len(writer.path.read_bytes().splitlines()) == 2:
            break
    assert writer.path.read_text() == '{"n":1}\n{"n":2}\n'
    writer.append({"n": 3})
    await writer.aclose()
    assert writer.path.read_text().splitlines()[-1] == '{"n":3}'


@pytest.mark.asyncio
async def test_the_receive_time_comes_first_in_iso_8601_utc(tmp_path: Path) -> None:
    writer = TranscriptWriter(tmp_path / "x.jsonl", redactor=Redactor())
    writer.append({"kind": "event"}, at=1_700_000_000.25)
    writer.append({"kind": "event"})
    await writer.aclose()
    first, second = (json.loads(line) for line in writer.path.read_text().splitlines())
    assert list(first) == ["at", "kind"]
    assert first["at"] == "2023-11-14T22:13:20.250000+00:00"
    assert second == {"kind": "event"}


@pytest.mark.asyncio
async def test_a_line_that_cannot_be_written_is_lost_alone(tmp_path: Path) -> None:
    writer = TranscriptWriter(tmp_path / "x.jsonl", redactor=Redactor())
    writer.append({"n": 1})
    writer.append({"text": "\ud800"})  # a lone surrogate has no UTF-8 form
    writer.append({"n": 3})
    await writer.aclose()
    assert writer.path.read_text() == '{"n":1}\n{"n":3}\n'
    assert isinstance(writer.error, UnicodeEncodeError)


@pytest.mark.asyncio
async def test_an_empty_transcript_still_gets_its_file(tmp_path: Path) -> None:
    writer = TranscriptWriter(tmp_path / "t" / "x.jsonl", redactor=Redactor())
    await writer.aclose()
    await writer.aclose()
    assert writer.path.read_bytes() == b""
    assert writer.error is None
