"""The results API and `haico report` over a 100,000-record campaign.

Run: python benchmarks/results.py [--repeats N] [--records R]

The campaign is 2 arms x 2 strata, each arm's records over 25 run ledgers; four in
five records are of schema 2 (settings, tags, identities as objects, expectation
results per turn), one in five of schema 1 (identities as strings holding JSON); three
turns each, a realistic verdict mix with retries, every fifth ledger ending in a torn
line, one transcript file per record and a few orphans. Each figure is the median of
N rounds, each round running every case once (so a load that changes during the run
weighs on every case alike), next to baselines measured in the same rounds on the same
files:

* bytes: reading every ledger and splitting it into lines, the I/O floor;
* json: `json.loads` of every line, the parse floor of any reader.

Targets: `load_results` under 2 s, of every record and streamed (`newest_only=True` with
the terminal report's `fields`, what `haico report` reads; the call: the caller keeps what
it returns, so freeing it is not in the figure); `haico report` (terminal) under 3 s as a
fresh `haico` process, what a user runs (its CPU is the child's). In-process
(`main(["report", ...])`) is shown too: there the records are also freed (the command's
own process exits without freeing them). Reported, never asserted.

Memory: the peak RSS of a fresh process (its VmHWM: getrusage would count the memory of
this process, which it was forked from) that loads every record,
that streams (`newest_only=True` with the terminal report's `fields`), and of `haico
report`, against a process that only imports the results API.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from pytest_haico.cli.main import main as haico
from pytest_haico.report.data import REPORT_FIELDS
from pytest_haico.results import load_results

LOAD_TARGET_S = 2.0
REPORT_TARGET_S = 3.0
ARMS = ("qwen32b", "llama8b")
STRATA = ("short", "long")
RUNS_PER_ARM = 25
VERDICTS = (
    ["completed"] * 85
    + ["expectation_failed"] * 5
    + ["recursion_limit"] * 3
    + ["infra_error"] * 4
    + ["interrupted"] * 3
)
T0 = datetime(2026, 11, 1, tzinfo=UTC)


def _turn(index: int, rng: random.Random, *, schema: int) -> dict[str, Any]:
    turn: dict[str, Any] = {
        "index": index,
        "thread_id": "0f8fad5b-d9cb-469f-a165-70867728950e",
        "branch_from": None,
        "latency_s": rng.uniform(5, 20),
        "first_event_s": 0.8,
        "steps": 4,
        "tool_calls": 2,
        "tool_errors": 0,
        "tokens_in": 2400,
        "tokens_out": rng.randint(200, 600),
        "provider": "vllm",
        "model_id": "Qwen/Qwen2.5-32B-Instruct",
        "snapshot_id": "7c9e6679-7425-40de-944b-e07fc1f66afe",
    }
    if schema == 2:
        turn["expectations"] = [{"expect": "artifact", "passed": True, "seen": "artifact"}]
    return turn


def record(
    arm: str, run_id: str, item: int, attempt: int, rng: random.Random, *, schema: int
) -> dict[str, Any]:
    """One realistic ledger record (a dict, as its JSON line holds it)."""
    stratum = STRATA[item % 2]
    verdict = rng.choice(VERDICTS)
    duration = rng.uniform(20, 60) * (3 if stratum == "long" else 1)
    started = T0 + timedelta(seconds=item * 5 + attempt * 3600)
    model = {"path": f"/models/{arm}", "config_sha256": "cd" * 32, "index_sha256": "ce" * 32}
    backend = {"image": "docker://ghcr.io/haico/backend@sha256:" + "ef" * 32}
    data: dict[str, Any] = {
        "schema": schema,
        "run_id": run_id,
        "campaign": "bench",
        "arm": arm,
        "stratum": stratum,
        "item_id": f"{item:064x}",
        "nodeid": f"experiments/test_conversations.py::test_conversation[{arm}-s{item}-r0]",
        "script": f"s{item}",
        "script_sha256": "ab" * 32,
        "repeat": 0,
        "attempt": attempt,
        "outcome": "passed" if verdict == "completed" else "failed",
        "verdict": verdict,
        "started_at": started.isoformat(timespec="microseconds"),
        "finished_at": (started + timedelta(seconds=duration)).isoformat(timespec="microseconds"),
        "duration_s": duration,
        "in_flight_at_start": 8,
        "model_identity": model if schema == 2 else json.dumps(model),
        "backend_identity": backend if schema == 2 else "oci:" + json.dumps(backend),
        "turns": [_turn(i, rng, schema=schema) for i in range(3)],
        "error": None if verdict == "completed" else {"kind": verdict, "message": "looped"},
        "slurm": {
            "job_id": run_id.split("_")[0],
            "array_job_id": "4711000",
            "array_task_id": "0",
            "node": "gpu017",
            "restart_count": 0,
        },
        "harness_version": "0.1.0",
    }
    if schema == 2:
        data["tags"] = ["smoke", stratum]
        data["settings"] = {
            "model": {"served_name": arm, "path": f"/models/{arm}"},
            "generation": {"max_tokens": 4096, "temperature": 0.0},
            "agent": {"recursion_limit": 50},
            "vllm": {"tensor_parallel_size": 2, "max_model_len": 32768},
        }
    return data


def write_campaign(root: Path, records: int) -> list[Path]:
    """`records` ledger lines over ARMS x RUNS_PER_ARM files, with their transcripts."""
    rng = random.Random(7)
    per_file = records // (len(ARMS) * RUNS_PER_ARM)
    files = []
    item = 0
    for arm in ARMS:
        transcripts = root / arm / "transcripts"
        transcripts.mkdir(parents=True)
        for run in range(RUNS_PER_ARM):
            run_id = f"{4711000 + run}_{run % 4}.1"
            run_dir = root / arm / "runs" / run_id
            run_dir.mkdir(parents=True)
            claimed = T0 + timedelta(seconds=(item + 1) * 5 - 240)
            (run_dir / "claim.json").write_text(json.dumps({"claimed_at": claimed.timestamp()}))
            (run_dir / "run-config.json").write_text(
                json.dumps({"values": {"VLLM_VERSION": "0.13.0", "NODE": "gpu017"}})
            )
            path = root / arm / "ledger" / f"{run_id}.jsonl"
            path.parent.mkdir(parents=True, exist_ok=True)
            lines = []
            for index in range(per_file):
                # One in ten lines retries an earlier item of this run.
                retry = index > 10 and index % 10 == 0
                number = item - 5 if retry else item + 1
                item = item if retry else item + 1
                data = record(
                    arm, run_id, number, 2 if retry else 1, rng, schema=1 if index % 5 == 0 else 2
                )
                lines.append(json.dumps(data, separators=(",", ":")).encode() + b"\n")
                name = f"{data['item_id']}.{run_id}.{data['attempt']}.jsonl"
                (transcripts / name).touch()
            (transcripts / f"{item + 1:064x}.{run_id}.1.jsonl").touch()  # killed mid-item
            if run % 5 == 0:
                lines[-1] = lines[-1][:300]  # killed mid-write
            path.write_bytes(b"".join(lines))
            files.append(path)
    return files


def cpu_s() -> float:
    """CPU seconds of this process and of its children that ended."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def medians_s(
    repeats: int, cases: dict[str, Callable[[], object]]
) -> dict[str, tuple[float, float]]:
    """Median wall-clock and CPU seconds of each case, over `repeats` rounds of every case."""
    wall: dict[str, list[float]] = {name: [] for name in cases}
    cpu: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(repeats):
        for name, action in cases.items():
            started, started_cpu = time.perf_counter(), cpu_s()
            kept = action()
            wall[name].append(time.perf_counter() - started)
            cpu[name].append(cpu_s() - started_cpu)
            del kept  # freeing what the call returned is its caller's, later
    return {name: (statistics.median(wall[name]), statistics.median(cpu[name])) for name in cases}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--records", type=int, default=100_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        campaign = Path(tmp) / "bench"
        files = write_campaign(campaign, args.records)
        size = sum(path.stat().st_size for path in files) / 1e6

        def read_bytes() -> int:
            return sum(len(path.read_bytes().split(b"\n")) for path in files)

        def parse() -> int:
            return sum(
                1
                for path in files
                for line in path.read_bytes().split(b"\n")
                if line and line.endswith(b"}") and json.loads(line)
            )

        def report() -> int:
            # The warnings about the torn lines go to stderr: kept out of the figures' way.
            with (
                contextlib.redirect_stdout(io.StringIO()),
                contextlib.redirect_stderr(io.StringIO()),
            ):
                return haico(["report", str(campaign)])

        def report_process() -> int:
            command = [sys.executable, "-m", "pytest_haico", "report", str(campaign)]
            env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
            return subprocess.run(command, capture_output=True, env=env, check=True).returncode

        results = load_results(campaign)
        assert report() == 0
        cases: dict[str, Callable[[], object]] = {
            "load_results": lambda: load_results(campaign),
            "load_results, streamed": lambda: load_results(
                campaign, newest_only=True, fields=REPORT_FIELDS
            ),
            "haico report": report,
            "haico report (process)": report_process,
            "bytes + split lines": read_bytes,
            "json.loads of every line": parse,
        }
        try:
            import pandas  # noqa: F401

            cases["load_results + frame()"] = lambda: load_results(campaign).frame()
        except ImportError:
            print("  (pandas is not installed: frame() not measured)")
        figures = medians_s(args.repeats, cases)
        peaks = peak_memory(campaign)
        print(
            f"{len(results.records):,} records ({size:.0f} MB, {len(files)} ledgers, "
            f"{len(results.newest()):,} items, {len(results.orphans)} orphans, "
            f"{len(results.warnings)} warnings), median of {args.repeats} rounds:"
        )
        targets = {
            "load_results": LOAD_TARGET_S,
            "load_results, streamed": LOAD_TARGET_S,
            "haico report (process)": REPORT_TARGET_S,
        }
        floor = figures["json.loads of every line"][0]
        for name, (wall, cpu) in figures.items():
            line = f"  {name}: {wall:.3f} s ({cpu:.3f} s CPU)"
            if name in targets:
                target = targets[name]
                met = f"met, {target / wall:.1f}x headroom" if wall < target else "NOT met"
                line += f"; target under {target:.0f} s: {met}; {wall / floor:.2f}x json"
            print(line)
        base = peaks.pop("import only")
        print(f"peak RSS of a fresh process (import only: {base:.0f} MB):")
        for name, peak in peaks.items():
            print(f"  {name}: {peak:.0f} MB ({peak / base:.1f}x import only)")


def peak_memory(campaign: Path) -> dict[str, float]:
    """Peak RSS in MB of a fresh Python process for each way of reading `campaign`."""
    load = "from pytest_haico.results import load_results; import sys; "
    scripts = {
        "import only": load.rstrip("; "),
        "load_results, every record": f"{load}r = load_results(sys.argv[1])",
        "load_results, newest_only + the report's fields": (
            f"{load}from pytest_haico.report.data import REPORT_FIELDS; "
            "r = load_results(sys.argv[1], newest_only=True, fields=REPORT_FIELDS)"
        ),
        "haico report": (
            "import sys; from pytest_haico.cli.main import main; main(['report', sys.argv[1]])"
        ),
    }
    peaks = {}
    for name, script in scripts.items():
        # The child's own high-water mark, printed to stderr last.
        status = "\nprint(open('/proc/self/status').read(), file=sys.stderr)"
        child = subprocess.run(
            [sys.executable, "-c", script + status, str(campaign)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            check=True,
        )
        (line,) = [x for x in child.stderr.splitlines() if x.startswith("VmHWM:")]
        peaks[name] = int(line.split()[1]) / 1024  # kB
    return peaks


if __name__ == "__main__":
    main()
