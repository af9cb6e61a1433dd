"""Benchmark: the stand-in backend's CPU per turn and its start-up, this tree against a baseline.

Run: python benchmarks/standin_backend.py [--baseline REF] [--conversations N] [--turns T]
     [--concurrency C] [--repeats R] [--artifacts] [--baseline-without uvloop,httptools]

One Postgres and one stand-in model server (persona helpful, no latency) serve every run.
Each run starts a stand-in backend on a fresh database (so start-up includes its
migrations, as in a stack), from this tree or from REF's `pytest_haico` (exported
with `git archive`; default: the merge-base with main), sends two warm-up turns, then N
conversations of T turns at C in flight, and stops it. The two alternate (A B, B A, ...),
so a co-tenant's load moves both. Per run: spawn -> healthy (wall), the CPU spent by then,
and CPU per turn over the conversations, from /proc/<pid>/stat (utime + stime, the
process and its children). A turn is "question t of conversation i" (one model call, as in
benchmarks/campaign.py); --artifacts asks for a report instead (a tool call: two model
calls, three steps). Target: <= 10 ms of CPU per turn.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import httpx
import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from pytest_haico.procfs import read_proc_stat
from pytest_haico.stack import Orchestrator, PostgresService
from pytest_haico.stack.local import build_llm_service
from pytest_haico.stack.service import new_secret

TARGET_MS = 10.0
ADMIN_TOKEN = new_secret()  # per run, as the stack makes them
API_KEY = new_secret()
_TICK_S = 1 / os.sysconf("SC_CLK_TCK")
REPOSITORY = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Run:
    healthy_s: float  # spawn -> /api/health answers 200
    startup_cpu_s: float  # CPU spent by then
    cpu_ms_per_turn: float
    turns_s: float  # wall of the measured turns

    def line(self) -> str:
        return (
            f"healthy {self.healthy_s:5.2f} s (CPU {self.startup_cpu_s:4.2f} s)  "
            f"{self.cpu_ms_per_turn:5.1f} ms CPU/turn  turns {self.turns_s:5.2f} s"
        )


def cpu_seconds(pid: int) -> float:
    """utime + stime of `pid` and of its children, living and reaped."""
    stat = read_proc_stat(pid)
    if stat is None:
        return 0.0
    ticks = stat.cpu_ticks + stat.children_cpu_ticks
    for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
        child_stat = read_proc_stat(int(child))
        ticks += child_stat.cpu_ticks if child_stat is not None else 0
    return ticks * _TICK_S


def export_baseline(ref: str, into: Path) -> Path:
    """`pytest_haico` as of `ref`, under `into`; the directory to run it from."""
    archive = into / "baseline.tar"
    subprocess.run(
        ["git", "archive", "--format=tar", "-o", str(archive), ref, "pytest_haico"],
        cwd=REPOSITORY,
        check=True,
    )
    with tarfile.open(archive) as tar:
        tar.extractall(into / "baseline", filter="data")
    return into / "baseline"


async def conversation(
    client: httpx.AsyncClient, base: str, body: dict[str, object], n: int
) -> None:
    """`n` turns of one new thread, one after the other."""
    thread = f"bench-{uuid.uuid4().hex[:12]}"
    for t in range(n):
        query = body["query"] if body["query"] else f"question {t} of conversation {thread}"
        payload = {**body, "query": query, "thread_id": thread}
        headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        url = f"{base}/api/query/stream_steps/sse"
        async with client.stream("POST", url, json=payload, headers=headers) as response:
            text = (await response.aread()).decode()
        last = json.loads(text.strip().rsplit("\n\n", 1)[-1].removeprefix("data: "))
        if response.status_code != 200 or last["type"] != "complete":
            sys.exit(f"a turn failed ({response.status_code}): {text[-500:]}")


async def campaign(base: str, body: dict[str, object], n: int, turns: int, limit: int) -> None:
    gate = asyncio.Semaphore(limit)
    async with httpx.AsyncClient(trust_env=False, timeout=120) as client:

        async def one() -> None:
            async with gate:
                await conversation(client, base, body, turns)

        await asyncio.gather(*(one() for _ in range(n)))


def wait_healthy(base: str, process: subprocess.Popen[bytes], log: Path) -> None:
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    while process.poll() is None:
        try:
            if httpx.get(f"{base}/api/health", headers=headers, trust_env=False).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.01)
    sys.exit(f"the backend exited {process.returncode}: {log.read_text()[-2000:]}")


def free_port() -> int:
    """A loopback port that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def fresh_database(dsn: str) -> str:
    """A new, empty database on the server of `dsn` (as a stack's is); its DSN."""
    name = "bench_" + uuid.uuid4().hex[:12]
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return make_conninfo(dsn, dbname=name)


def backend_argv(port: int, without: tuple[str, ...]) -> list[str]:
    """The backend's command; `without`: modules it must run as if not installed."""
    argv = ["-m", "pytest_haico.standins.backend", "--port", str(port)]
    if without:  # uvicorn's "auto" picks uvloop and httptools whenever it can import them
        hide = f"import sys; sys.modules.update(dict.fromkeys({list(without)!r}))"
        run = "import runpy; runpy.run_module('pytest_haico.standins.backend', run_name='__main__')"
        argv = ["-c", f"{hide}; sys.argv[0] = 'backend'; {run}", "--port", str(port)]
    return [sys.executable, *argv]


def run_backend(
    cwd: Path, dsn: str, body: dict[str, object], args: argparse.Namespace, without: tuple[str, ...]
) -> Run:
    """One backend from `cwd`'s `pytest_haico` on a fresh database: started, warmed up,
    measured, stopped."""
    port = free_port()
    env = {
        **os.environ,
        "ADMIN_DEFAULT_API_TOKEN": ADMIN_TOKEN,
        "VLLM_API_KEY": API_KEY,
        "HAICO_DATABASE_URL": fresh_database(dsn),
    }
    argv = backend_argv(port, without)
    with tempfile.NamedTemporaryFile(suffix=".log") as log:
        began = time.perf_counter()
        process = subprocess.Popen(argv, cwd=cwd, env=env, stderr=log)
        try:
            base = f"http://127.0.0.1:{port}"
            wait_healthy(base, process, Path(log.name))
            healthy = time.perf_counter() - began
            startup_cpu = cpu_seconds(process.pid)
            asyncio.run(campaign(base, body, 2, 1, 2))  # warm-up
            cpu_before, wall_before = cpu_seconds(process.pid), time.perf_counter()
            asyncio.run(campaign(base, body, args.conversations, args.turns, args.concurrency))
            cpu = cpu_seconds(process.pid) - cpu_before
            wall = time.perf_counter() - wall_before
        finally:
            process.terminate()
            process.wait(30)
    turns = args.conversations * args.turns
    return Run(healthy, startup_cpu, cpu * 1000 / turns, wall)


def turn_body(endpoint: str, *, artifacts: bool) -> dict[str, object]:
    """A query's body; an empty query is filled in per turn."""
    model = {"API": "openai", "model_id": "m", "endpoint_url": endpoint, "max_tokens": 512}
    return {
        "query": "Write a report on Crete." if artifacts else "",
        "config": {"model": {**model, "temperature": 0.0}, "agent": {"recursion_limit": 10}},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default=None, help="git ref (default: merge-base with main)")
    parser.add_argument("--conversations", type=int, default=30)
    parser.add_argument("--turns", type=int, default=3, help="turns per conversation")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3, help="runs of each (default 3)")
    parser.add_argument("--artifacts", action="store_true", help="turns that call the tool")
    parser.add_argument(
        "--baseline-without",
        default="",
        help="modules the baseline runs without, comma-separated (dependencies added since; "
        "e.g. uvloop,httptools against a ref from before the stand-ins' extra had them)",
    )
    args = parser.parse_args()
    ref = (
        args.baseline
        or subprocess.run(
            ["git", "merge-base", "HEAD", "main"],
            cwd=REPOSITORY,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    hidden = tuple(name for name in args.baseline_without.split(",") if name)
    runs: dict[str, list[Run]] = {"baseline": [], "this tree": []}
    with tempfile.TemporaryDirectory(prefix="haico-bench-backend-") as tmp:
        trees = {"baseline": export_baseline(ref, Path(tmp)), "this tree": REPOSITORY}
        postgres = PostgresService()
        llm = build_llm_service(
            served_name="m",
            max_model_len=8192,
            tool_call_parser="hermes",
            persona="helpful",
            latency_ms=0,
            seed=0,
            api_key=API_KEY,
        )
        with Orchestrator([postgres, llm], Path(tmp) / "logs") as stack:
            endpoint = f"http://vllm.localhost:{stack.processes['llm'].port}/v1"
            body = turn_body(endpoint, artifacts=args.artifacts)
            for repeat in range(args.repeats):
                order = list(trees) if repeat % 2 == 0 else list(reversed(trees))
                for name in order:
                    load = os.getloadavg()[0]
                    without = hidden if name == "baseline" else ()
                    run = run_backend(trees[name], postgres.dsn, body, args, without)
                    runs[name].append(run)
                    print(f"  {name:<9}  {run.line()}  load {load:.1f} before", flush=True)

    def med(name: str, field: str) -> float:
        return statistics.median(float(getattr(run, field)) for run in runs[name])

    turns = args.conversations * args.turns
    kind = "artifact turns (two model calls)" if args.artifacts else "one-call turns"
    print(
        f"medians of {args.repeats} runs each: {turns} {kind} at {args.concurrency} in flight; "
        f"baseline {ref[:12]}" + (f" without {', '.join(hidden)}" if hidden else "")
    )
    for field, label, unit in (
        ("cpu_ms_per_turn", "CPU per turn", "ms"),
        ("healthy_s", "spawn -> healthy", "s"),
        ("startup_cpu_s", "CPU to healthy", "s"),
    ):
        base, this = med("baseline", field), med("this tree", field)
        print(
            f"  {label:<17} baseline {base:6.2f} {unit:<2}  this tree {this:6.2f} {unit:<2}"
            f"  ratio {this / base:4.2f}x"
        )
    print(f"  target: <= {TARGET_MS:g} ms CPU per turn")


if __name__ == "__main__":
    main()
