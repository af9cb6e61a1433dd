"""The demo-shaped campaign through the full local stack: concurrency 16 vs 1, and memory at 64.

Run: python benchmarks/campaign.py [--conversations N] [--memory-conversations M]

Reported without a target (two shared cores bound the stand-ins), except the peak
memory of the pytest process at concurrency 64 (target <= 300 MB). The ideal is
conversations x turns x model latency / concurrency.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TURNS = 3
LATENCY_MS = 100

TEST_MODULE = """
from pytest_haico import Verdict


def test_conversation(haico_conversation):
    assert haico_conversation.verdict is Verdict.COMPLETED, haico_conversation.explain()
"""

# Written by the pytest process itself: its own peak resident set, as the kernel counts it.
CONFTEST = """
import json
import os
import os
from pathlib import Path


def pytest_unconfigure(config):
    status = Path("/proc/self/status").read_text()
    peak_kb = int(next(line.split()[1] for line in status.splitlines()
                       if line.startswith("VmHWM:")))
    Path(os.environ["HAICO_BENCH_MEMORY"]).write_text(json.dumps({"peak_mb": peak_kb / 1024}))
"""


def write_project(root: Path, conversations: int, concurrency: int) -> None:
    experiments = root / "experiments"
    (experiments / "arms").mkdir(parents=True)
    (experiments / "scripts").mkdir()
    (root / "pyproject.toml").write_text(
        '[tool.pytest.ini_options]\nasyncio_default_fixture_loop_scope = "function"\n'
        'addopts = "-p no:langsmith_plugin"\n'
    )
    (experiments / "arms" / "bench.toml").write_text(
        f"[run]\nconcurrency = {concurrency}\n[standin]\nlatency_ms = {LATENCY_MS}\n"
    )
    lines = []
    for i in range(conversations):
        turns = [{"user": f"question {t} of conversation {i}"} for t in range(TURNS)]
        lines.append(json.dumps({"id": f"c{i:04d}", "turns": turns}))
    (experiments / "scripts" / "bench.jsonl").write_text("\n".join(lines) + "\n")
    (experiments / "test_conversations.py").write_text(TEST_MODULE)
    (experiments / "conftest.py").write_text(CONFTEST)


def run(conversations: int, concurrency: int) -> tuple[float, float, str]:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_project(root, conversations, concurrency)
        memory = root / "memory.json"
        started = time.perf_counter()
        result = subprocess.run(
            [sys.executable, "-m", "pytest", "experiments", "-q", "-p", "no:cacheprovider"],
            cwd=root,
            capture_output=True,
            text=True,
            env={**os.environ, "HAICO_BENCH_MEMORY": str(memory)},
        )
        elapsed = time.perf_counter() - started
        summary = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else "?"
        if result.returncode != 0:
            print(result.stdout[-3000:], result.stderr[-3000:], file=sys.stderr)
        return elapsed, json.loads(memory.read_text())["peak_mb"], summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--conversations", type=int, default=64)
    parser.add_argument("--memory-conversations", type=int, default=200)
    args = parser.parse_args()
    n = args.conversations
    for concurrency in (16, 1):
        elapsed, peak, summary = run(n, concurrency)
        ideal = n * TURNS * LATENCY_MS / 1000 / concurrency
        print(
            f"{n} conversations x {TURNS} turns at concurrency {concurrency:>2}: "
            f"{elapsed:.1f} s whole process (ideal model time {ideal:.1f} s; "
            f"peak {peak:.0f} MB) -- {summary}"
        )
    m = args.memory_conversations
    elapsed, peak, summary = run(m, 64)
    print(
        f"{m} conversations at concurrency 64: {elapsed:.1f} s, peak memory of the pytest "
        f"process {peak:.0f} MB (target <= 300 MB) -- {summary}"
    )


if __name__ == "__main__":
    main()
