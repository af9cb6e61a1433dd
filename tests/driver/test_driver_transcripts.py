"""The transcript writer: ordered lines, written off the event loop, closed and redacted."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any

import pytest

from pytest_haico.redact import Redactor
from pytest_haico.transcripts import TranscriptWriter, transcript_path


def test_transcript_path_follows_the_results_layout(tmp_path: Path) -> None:
    path = transcript_path(tmp_path / "qwen32b", item_id="abc", run_id="123_4.0", attempt=2)
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
