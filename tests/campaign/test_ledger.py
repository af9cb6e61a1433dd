"""The ledger: durable one-line appends, and a reader that survives kills and hand edits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_haico.ledger.format import SCHEMA_VERSION, iter_ledger, iter_ledger_dir
from pytest_haico.ledger.jsonl import LedgerWriter
from pytest_haico.ledger.records import LedgerRecord, record_line
from pytest_haico.ledger.resume import ResumeIndex
from pytest_haico.ledger.verdicts import Verdict


def make_record(
    item_id: str = "a" * 64,
    *,
    verdict: Verdict = Verdict.COMPLETED,
    attempt: int = 1,
    finished_at: str = "2026-01-01T00:00:01+00:00",
) -> LedgerRecord:
    return LedgerRecord(
        run_id="local-1.1",
        campaign="default",
        arm="demo",
        stratum="default",
        item_id=item_id,
        nodeid="t::x",
        script="s",
        script_sha256="0" * 64,
        repeat=0,
        attempt=attempt,
        outcome=verdict.outcome,
        verdict=verdict,
        started_at="2026-01-01T00:00:00+00:00",
        finished_at=finished_at,
        duration_s=1.0,
        model_identity={"kind": "unknown", "text": "m"},
        backend_identity={"kind": "unknown", "text": "b"},
        harness_version="0",
    )


def read(path: Path) -> tuple[list[dict[str, object]], list[str]]:
    warnings: list[str] = []
    return [r.data for r in iter_ledger(path, warn=warnings.append)], warnings


def test_append_writes_one_fsynced_line_per_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    synced: list[int] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(fd)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    writer = LedgerWriter(tmp_path / "ledger" / "run.jsonl")
    writer.append(make_record("a" * 64))
    writer.append(make_record("b" * 64))
    writer.close()
    lines = (tmp_path / "ledger" / "run.jsonl").read_text().splitlines()
    assert [json.loads(line)["item_id"] for line in lines] == ["a" * 64, "b" * 64]
    assert json.loads(lines[0])["schema"] == SCHEMA_VERSION == 2
    assert len(synced) == 2


def test_reader_skips_a_torn_last_line_with_a_warning(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    good = record_line(make_record())
    path.write_bytes(good + good[: len(good) // 2])
    records, warnings = read(path)
    assert len(records) == 1
    assert warnings == [f"{path}:2: skipped a torn last line (a kill mid-write?)"]
    assert path.read_bytes() == good + good[: len(good) // 2]  # never rewritten


def test_reader_survives_empty_garbage_and_future_schema(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_bytes(b"")
    future = json.dumps({"schema": 3, "item_id": "x"}).encode() + b"\n"
    (tmp_path / "b.jsonl").write_bytes(
        b"not json\n" + future + b"[1]\n" + record_line(make_record())
    )
    warnings: list[str] = []
    records = list(iter_ledger_dir(tmp_path, warn=warnings.append))
    assert [r.line for r in records] == [4]
    assert warnings == [
        f"{tmp_path / 'b.jsonl'}:1: skipped not valid JSON",
        f"{tmp_path / 'b.jsonl'}:2: skipped a record of schema 3, newer than this pytest-haico "
        "reads (2); upgrade pytest-haico",
        f"{tmp_path / 'b.jsonl'}:3: skipped, not a JSON object",
    ]


def test_next_append_after_a_torn_line_starts_on_a_fresh_line(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    path.write_bytes(record_line(make_record("a" * 64)) + b'{"schema": 1, "item_')
    writer = LedgerWriter(path)
    writer.append(make_record("b" * 64))
    writer.close()
    records, warnings = read(path)
    assert [r["item_id"] for r in records] == ["a" * 64, "b" * 64]
    assert warnings == [f"{path}:2: skipped not valid JSON"]


def test_resume_index_keeps_the_newest_record(tmp_path: Path) -> None:
    writer = LedgerWriter(tmp_path / "r.jsonl")
    writer.append(
        make_record(
            "a" * 64,
            verdict=Verdict.INFRA_ERROR,
            attempt=1,
            finished_at="2026-01-01T00:00:01+00:00",
        )
    )
    writer.append(
        make_record(
            "a" * 64, verdict=Verdict.COMPLETED, attempt=2, finished_at="2026-01-01T00:00:05+00:00"
        )
    )
    writer.append(
        make_record(
            "b" * 64,
            verdict=Verdict.INTERRUPTED,
            attempt=2,
            finished_at="2026-01-01T00:00:03+00:00",
        )
    )
    writer.close()
    index = ResumeIndex()
    index.add_all(iter_ledger_dir(tmp_path, warn=pytest.fail), warn=pytest.fail)
    a, b = index.get("a" * 64), index.get("b" * 64)
    assert a is not None and a.done and a.verdict is Verdict.COMPLETED
    assert b is not None and not b.done and b.next_attempt == 2  # interrupted: not counted
    assert index.get("c" * 64) is None


def test_the_fast_resume_read_agrees_with_the_full_parse(tmp_path: Path) -> None:
    writer = LedgerWriter(tmp_path / "a.jsonl")
    writer.append(make_record("a" * 64, verdict=Verdict.INFRA_ERROR, attempt=2))
    writer.append(make_record("b" * 64, verdict=Verdict.COMPLETED))
    writer.close()
    by_hand = {
        "finished_at": "2026-01-02T00:00:00+00:00",
        "verdict": "interrupted",
        "attempt": 1,
        "item_id": "c" * 64,
        "schema": 1,
    }
    (tmp_path / "b.jsonl").write_text(
        json.dumps(by_hand, indent=None) + "\n" + "garbage\n" + '{"schema":1,"item_id":"d'
    )
    keys = ("item_id", "attempt", "verdict", "finished_at")
    results = []
    for fast in (False, True):
        warnings: list[str] = []
        records = iter_ledger_dir(tmp_path, warn=warnings.append, resume_fields=fast)
        results.append(([tuple(r.data[k] for k in keys) for r in records], warnings))
    assert results[0] == results[1]
    assert [fields[0][0] for fields in results[0][0]] == ["a", "b", "c"]
    assert len(results[0][1]) == 2
