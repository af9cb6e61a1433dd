"""`haico cost` over a 100,000-record campaign: how long `load_costs` reads its ledgers.

Run: python benchmarks/cost.py [--repeats N] [--records R]

The campaign is 2 arms x 2 strata, each arm's records spread over 25 run ledgers as the
runner writes them (`record_line`, three turns each, a realistic verdict mix),
every fifth ledger ending in a torn line as a walltime kill leaves it. Each figure is
the median of N runs in this process, next to baselines measured in the same run on
the same files, so a noisy shared machine moves them all:

* bytes: reading every ledger and splitting it into lines, the I/O floor;
* resume: `iter_ledger_dir(resume_fields=True)`, what resume reads at collection;
* full parse: `iter_ledger_dir` with a JSON parse of every line, what `load_costs` would
  cost without its fast path.

Target: `load_costs` well under 2 s for 100,000 records (the headroom is printed).
Reported, never asserted; the measured counts are checked against the full parse's.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from pytest_haico.ledger.format import iter_ledger_dir
from pytest_haico.ledger.records import ErrorInfo, LedgerRecord, SlurmInfo, TurnRecord, record_line
from pytest_haico.ledger.verdicts import MEASURED_VERDICTS, Verdict
from pytest_haico.report.item_costs import load_costs

TARGET_S = 2.0
ARMS = ("qwen32b", "llama8b")
STRATA = ("short", "long")
RUNS_PER_ARM = 25
VERDICTS = (
    [Verdict.COMPLETED] * 85
    + [Verdict.EXPECTATION_FAILED] * 5
    + [Verdict.RECURSION_LIMIT] * 3
    + [Verdict.INFRA_ERROR] * 4
    + [Verdict.INTERRUPTED] * 3
)
T0 = datetime(2026, 11, 1, tzinfo=UTC)
# What schema 2 records carry besides the fields the cost reads (after them on the line).
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


def write_campaign(root: Path, records: int) -> list[Path]:
    """The campaign's ledgers: `records` lines over ARMS x RUNS_PER_ARM files."""
    rng = random.Random(7)
    per_file = records // (len(ARMS) * RUNS_PER_ARM)
    turn = TurnRecord(
        index=0,
        thread_id="0f8fad5b-d9cb-469f-a165-70867728950e",
        latency_s=14.2,
        first_event_s=0.8,
        steps=4,
        tool_calls=2,
        tokens_in=2400,
        tokens_out=380,
        provider="vllm",
        model_id="Qwen/Qwen2.5-32B-Instruct",
        snapshot_id="7c9e6679-7425-40de-944b-e07fc1f66afe",
    )
    files = []
    item = 0
    for arm in ARMS:
        for run in range(RUNS_PER_ARM):
            run_id = f"{4711000 + run}_{run % 4}.1"
            path = root / arm / "ledger" / f"{run_id}.jsonl"
            path.parent.mkdir(parents=True, exist_ok=True)
            lines = []
            for _ in range(per_file):
                item += 1
                stratum = STRATA[item % 2]
                verdict = rng.choice(VERDICTS)
                duration = rng.uniform(20, 60) * (3 if stratum == "long" else 1)
                started = T0 + timedelta(seconds=item * 5)
                record = LedgerRecord(
                    run_id=run_id,
                    campaign="bench",
                    arm=arm,
                    stratum=stratum,
                    item_id=f"{item:064x}",
                    nodeid=f"experiments/test_conversations.py::test_conversation[{arm}-s{item}-r0]",
                    script=f"s{item}",
                    script_sha256="ab" * 32,
                    repeat=0,
                    attempt=1,
                    outcome=verdict.outcome,
                    verdict=verdict,
                    started_at=started.isoformat(timespec="microseconds"),
                    finished_at=(started + timedelta(seconds=duration)).isoformat(
                        timespec="microseconds"
                    ),
                    duration_s=duration,
                    in_flight_at_start=8,
                    model_identity=MODEL_IDENTITY,
                    backend_identity=BACKEND_IDENTITY,
                    tags=("smoke",),
                    settings=SETTINGS,
                    turns=(turn, turn.model_copy(update={"index": 1}), turn),
                    error=None
                    if verdict is Verdict.COMPLETED
                    else ErrorInfo(kind=verdict.value, message="the model looped"),
                    slurm=SlurmInfo(
                        job_id=str(4711000 + run),
                        array_job_id=str(4711000),
                        array_task_id=str(run % 4),
                        node="gpu017",
                        restart_count=0,
                    ),
                    harness_version="0.1.0",
                )
                lines.append(record_line(record))
            if run % 5 == 0:
                lines[-1] = lines[-1][:300]  # killed mid-write
            path.write_bytes(b"".join(lines))
            files.append(path)
    return files


def read_bytes(files: list[Path]) -> int:
    return sum(len(path.read_bytes().split(b"\n")) for path in files)


def measured_by_full_parse(ledgers: list[Path]) -> dict[tuple[str, str], int]:
    """Measured attempts per (arm, stratum), counted from `iter_ledger_dir`'s full parse."""
    counts: dict[tuple[str, str], int] = {}
    for directory in ledgers:
        for record in iter_ledger_dir(directory, warn=lambda _: None):
            data = record.data
            if data["verdict"] in MEASURED_VERDICTS and data["duration_s"] is not None:
                key = (directory.parent.name, data["stratum"])
                counts[key] = counts.get(key, 0) + 1
    return counts


def median_s(repeats: int, action: Callable[[], object]) -> tuple[float, float]:
    """Median wall-clock and CPU seconds of `action` (CPU time moves less on a busy machine)."""
    wall, cpu = [], []
    for _ in range(repeats):
        started, started_cpu = time.perf_counter(), time.process_time()
        action()
        wall.append(time.perf_counter() - started)
        cpu.append(time.process_time() - started_cpu)
    return statistics.median(wall), statistics.median(cpu)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--records", type=int, default=100_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        campaign = Path(tmp) / "bench"
        files = write_campaign(campaign, args.records)
        size = sum(path.stat().st_size for path in files) / 1e6
        ledgers = [campaign / arm / "ledger" for arm in ARMS]
        quiet: Callable[[str], None] = lambda _: None  # noqa: E731

        def resume() -> int:
            return sum(
                1 for d in ledgers for _ in iter_ledger_dir(d, warn=quiet, resume_fields=True)
            )

        def full() -> int:
            return sum(1 for d in ledgers for _ in iter_ledger_dir(d, warn=quiet))

        costs = load_costs(campaign, warn=quiet)
        measured = sum(cost.n for cost in costs.values())
        assert len(costs) == len(ARMS) * len(STRATA), costs.keys()
        assert resume() == full()  # both readers see the same records
        assert {key: cost.n for key, cost in costs.items()} == measured_by_full_parse(ledgers)

        cases = {
            "load_costs": lambda: load_costs(campaign, warn=quiet),
            "bytes + split lines": lambda: read_bytes(files),
            "resume fast path": resume,
            "full JSON parse": full,
        }
        figures = {name: median_s(args.repeats, action) for name, action in cases.items()}

        print(
            f"{args.records:,} records ({size:.0f} MB, {len(files)} ledgers, "
            f"{measured:,} measured) in {len(costs)} arm x stratum, median of {args.repeats}:"
        )
        wall, cpu = figures["load_costs"]
        verdict = f"met, {TARGET_S / wall:.1f}x headroom" if wall < TARGET_S else "NOT met"
        print(
            f"  load_costs: {wall:.3f} s ({cpu:.3f} s CPU); target under {TARGET_S:.0f} s: "
            f"{verdict}"
        )
        for name, (base_wall, base_cpu) in list(figures.items())[1:]:
            print(
                f"  {name}: {base_wall:.3f} s ({base_cpu:.3f} s CPU); load_costs/{name.split()[0]} "
                f"{wall / base_wall:.2f}x ({cpu / base_cpu:.2f}x CPU)"
            )


if __name__ == "__main__":
    main()
