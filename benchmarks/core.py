"""Benchmarks of the campaign core: per-item overhead, and resume over a big ledger.

Run: python benchmarks/core.py [--repeats N]

Every figure is a median of whole pytest processes, next to a baseline measured
in the same run on the same machine, the two run in turns, so a noisy shared machine
moves both.
Bytecode is cached (a temporary PYTHONPYCACHEPREFIX, one untimed warm-up run of
each command first), as on any machine after the first run; this matters because
pytest rewrites the asserts of an entry-point plugin's modules at every import
when bytecode is not written.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

ITEMS = 2000
LEDGER_RECORDS = 100_000

PLAIN_TEST = """
import pytest

@pytest.mark.parametrize("n", range({items}))
def test_plain(n):
    pass
"""

HAICO_TEST = """
def test_conversation(haico_item):
    pass
"""

INI = '[tool.pytest.ini_options]\nasyncio_default_fixture_loop_scope = "function"\n'


def write_plain(root: Path, items: int) -> None:
    root.mkdir(parents=True)
    (root / "pyproject.toml").write_text(INI)
    (root / "test_plain.py").write_text(PLAIN_TEST.format(items=items))


def write_campaign(root: Path, items: int) -> None:
    (root / "experiments" / "arms").mkdir(parents=True)
    (root / "experiments" / "scripts").mkdir()
    (root / "pyproject.toml").write_text(INI)
    (root / "experiments" / "arms" / "demo.toml").write_text('description = "benchmark"\n')
    lines = [
        json.dumps({"id": f"s{i:06d}", "turns": [{"user": f"turn {i}"}]}) for i in range(items)
    ]
    (root / "experiments" / "scripts" / "all.jsonl").write_text("\n".join(lines) + "\n")
    (root / "experiments" / "test_conversations.py").write_text(HAICO_TEST)


ENV: dict[str, str] = {}


def timed(command: list[str], cwd: Path) -> float:
    started = time.perf_counter()
    subprocess.run(
        command,
        cwd=cwd,
        check=False,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=ENV,
    )
    return time.perf_counter() - started


def paired_medians(
    repeats: int, a: tuple[list[str], Path], b: tuple[list[str], Path]
) -> tuple[float, float]:
    """The medians of `a` and `b` run in turns (A B, B A, A B, ...), so that a load that rises
    or falls during the benchmark moves both alike; one untimed warm-up of each first
    (bytecode and rewritten asserts land in the cache)."""
    timed(*a)
    timed(*b)
    times: dict[int, list[float]] = {0: [], 1: []}
    for round_ in range(repeats):
        for which in (0, 1) if round_ % 2 == 0 else (1, 0):
            times[which].append(timed(*(a, b)[which]))
    return statistics.median(times[0]), statistics.median(times[1])


def pytest_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args]


# What schema 2 records of the demo arm carry besides the fields resume reads.
MODEL_IDENTITY: dict[str, Any] = {
    "kind": "path",
    "path": "/models/Qwen2.5-32B-Instruct",
    "config_sha256": "cd" * 32,
    "shard_index": "model.safetensors.index.json",
    "shard_index_sha256": "ef" * 32,
}
BACKEND_IDENTITY: dict[str, Any] = {"kind": "image", "image": "docker://haico@sha256:" + "01" * 32}
SETTINGS: dict[str, dict[str, Any]] = {
    "model": {"path": "/models/Qwen2.5-32B-Instruct", "hf_id": None, "revision": None},
    "vllm": {"tensor_parallel_size": 2, "data_parallel_size": 1, "max_model_len": 32768,
             "enable_tool_calling": True, "tool_call_parser": "hermes", "extra_args": []},
    "generation": {"max_tokens": 4096, "temperature": 0.0},
    "agent": {"recursion_limit": 50},
}  # fmt: skip


def fill_ledger(root: Path, records: int) -> Path:
    """A ledger of `records` completed items, written as the plugin writes them.

    Their items are not in the campaign, so every line is read and none deselects.
    """
    from pytest_haico.ledger.records import LedgerRecord, TurnRecord, record_line
    from pytest_haico.ledger.verdicts import Verdict

    ledger = root / "results" / "default" / "demo" / "ledger"
    ledger.mkdir(parents=True)
    turn = TurnRecord(
        index=0,
        thread_id="t",
        latency_s=1.2,
        first_event_s=0.1,
        steps=3,
        tool_calls=1,
        tokens_in=900,
        tokens_out=120,
        provider="vllm",
        model_id="demo",
        snapshot_id="s",
    )
    with open(ledger / "old.1.jsonl", "wb") as handle:
        for i in range(records):
            record = LedgerRecord(
                run_id="old.1",
                campaign="default",
                arm="demo",
                stratum="default",
                item_id=f"{i:064x}",
                nodeid=f"x[{i}]",
                script=f"x{i}",
                script_sha256="0" * 64,
                repeat=0,
                attempt=1,
                outcome=Verdict.COMPLETED.outcome,
                verdict=Verdict.COMPLETED,
                started_at="2026-01-01T00:00:00.000000+00:00",
                finished_at="2026-01-01T00:00:01.000000+00:00",
                duration_s=1.0,
                model_identity=MODEL_IDENTITY,
                backend_identity=BACKEND_IDENTITY,
                tags=("smoke",),
                settings=SETTINGS,
                turns=(turn, turn, turn),
                harness_version="0.1.0",
            )
            handle.write(record_line(record))
    return ledger


def index_peak_mb(ledger: Path) -> float:
    from pytest_haico.ledger.format import iter_ledger_dir
    from pytest_haico.ledger.resume import ResumeIndex

    tracemalloc.start()
    index = ResumeIndex()
    index.add_all(iter_ledger_dir(ledger, warn=print, resume_fields=True), warn=print)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert len(index) == LEDGER_RECORDS
    return peak / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    repeats = parser.parse_args().repeats
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        ENV.update(os.environ)
        ENV.pop("PYTHONDONTWRITEBYTECODE", None)
        ENV["PYTHONPYCACHEPREFIX"] = str(base / "pycache")
        write_plain(base / "plain", ITEMS)
        write_campaign(base / "campaign", ITEMS)
        plain, haico = paired_medians(
            repeats,
            (pytest_cmd(), base / "plain"),
            (pytest_cmd("experiments", "--haico-no-resume"), base / "campaign"),
        )
        print(f"{ITEMS} plain parametrised tests: {plain:.3f} s (median of {repeats}, in turns)")
        print(f"{ITEMS} trivial haico items (collection + fsynced ledger): {haico:.3f} s")
        print(
            f"  added per item: {(haico - plain) / ITEMS * 1000:.3f} ms (target <= 0.6 ms); "
            f"ratio haico/plain {haico / plain:.2f}"
        )

        empty, full = base / "resume-empty", base / "resume-full"
        write_campaign(empty, 100)
        write_campaign(full, 100)
        ledger = fill_ledger(full, LEDGER_RECORDS)
        size = sum(p.stat().st_size for p in ledger.glob("*.jsonl")) / 1e6
        collect = pytest_cmd("experiments", "--collect-only")
        without, with_ledger = paired_medians(repeats, (collect, empty), (collect, full))
        print(f"collection of 100 items, empty ledger: {without:.3f} s")
        print(
            f"collection with a {LEDGER_RECORDS:,}-record ledger ({size:.0f} MB): "
            f"{with_ledger:.3f} s"
        )
        print(
            f"  extra: {with_ledger - without:.3f} s (target <= 1.5 s); "
            f"ratio {with_ledger / without:.2f}"
        )
        print(f"  resume index peak memory: {index_peak_mb(ledger):.1f} MB (target < 50 MB)")


if __name__ == "__main__":
    main()
