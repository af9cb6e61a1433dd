"""Benchmark of the runner and driver against a bare asyncio + httpx loop on the same stub backend.

Run: python benchmarks/harness.py [--repeats N]

200 conversations × 3 turns, 100 ms per turn, 16 in flight, against a minimal SSE
stub backend in a subprocess (no LangGraph, no Postgres: a fake snapshot reader
answers for the arm's model). The harness side is `Runner` + `run_conversation`
with transcripts and an fsynced record per conversation; the raw side is one
httpx.AsyncClient under asyncio.Semaphore(16) sending the same 600 requests and
reading every stream to the end. A third side, `Runner` + those bare requests,
tells the runner's own cost from the driver's. All run in the same process, in
rotating order, so a noisy shared machine moves every side. Target: harness/raw <= 1.05.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import httpx

from pytest_haico.config.experiment import Arm, Script
from pytest_haico.driver.conversation import ConversationSetup, run_conversation
from pytest_haico.driver.result import ConversationResult
from pytest_haico.driver.snapshots import VLLM_PROVIDER, Snapshot
from pytest_haico.driver.wire import STREAM_PATH
from pytest_haico.ledger.verdicts import Verdict
from pytest_haico.runner.loop import Runner

CONVERSATIONS = 200
TURNS = 3
TURN_S = 0.1
CONCURRENCY = 16
TOKEN = "bench-token"
ENDPOINT = "http://127.0.0.1:9/v1"  # only echoed in the request body
ARM = Arm.model_validate(
    {
        "name": "bench",
        "model": {"served_name": "bench-model"},
        "generation": {"max_tokens": 512, "temperature": 0.0},
        "run": {"turn_timeout_s": 30.0},
    }
)
SCRIPT = Script.model_validate(
    {"id": "bench", "turns": [{"user": f"Question {i} of the benchmark."} for i in range(TURNS)]}
)


# -- the stub backend (runs in a subprocess) ---------------------------------------------


def _sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


async def _serve_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            body = json.loads(await reader.readexactly(length)) if length else {}
            thread = body.get("thread_id")
            await asyncio.sleep(TURN_S)
            step = {"content": "Here is the plan.", "message_type": "ai", "tool_calls": []}
            events = _sse({"type": "step", "thread_id": thread, "step": step}) + _sse(
                {
                    "type": "complete",
                    "thread_id": thread,
                    "recursion_limit_reached": False,
                    "usage": {"tokens_in": 100, "tokens_out": 20},
                }
            )
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                + f"content-length: {len(events)}\r\n\r\n".encode()
                + events
            )
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass  # the client closed the connection
    finally:
        writer.close()


async def _serve() -> None:
    server = await asyncio.start_server(_serve_connection, "127.0.0.1", 0, backlog=256)
    print(server.sockets[0].getsockname()[1], flush=True)
    async with server:
        await server.serve_forever()


def start_stub() -> tuple[subprocess.Popen[str], str]:
    """The stub backend in a subprocess, and its URL."""
    stub = subprocess.Popen([sys.executable, __file__, "--stub"], stdout=subprocess.PIPE, text=True)
    assert stub.stdout is not None
    port = stub.stdout.readline().strip()
    if not port:
        stub.kill()
        raise RuntimeError("the stub backend did not start")
    return stub, f"http://127.0.0.1:{port}"


# -- the harness side ----------------------------------------------------------------------


class FakeSnapshots:
    """Every turn was served by the arm's model."""

    async def read(self, thread_id: str, turn_index: int) -> Snapshot | None:
        return Snapshot(
            snapshot_id=f"{thread_id}-{turn_index}",
            thread_id=thread_id,
            turn_index=turn_index,
            branch_from=None,
            provider=VLLM_PROVIDER,
            model_id=ARM.served_name,
            created_at=datetime.now(UTC),
        )


def record(
    ledger: int, key: int, outcome: ConversationResult | BaseException | None, n: int
) -> Verdict:
    """What the campaign's finish() does: one fsynced JSON line per conversation."""
    if isinstance(outcome, BaseException):
        raise outcome
    verdict = Verdict.COMPLETED if outcome is None else outcome.verdict
    line = {"key": key, "verdict": verdict, "in_flight_at_start": n}
    os.write(ledger, json.dumps(line).encode() + b"\n")
    os.fsync(ledger)
    return verdict


def run_runner(url: str, workdir: Path, conversations: int, *, driver: bool = True) -> float:
    """Conversations through `Runner`: the driver's, or bare requests (to isolate the runner)."""
    started = time.perf_counter()
    workdir.mkdir()
    ledger = os.open(workdir / "ledger.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    runner: Runner[int, ConversationResult | None, Verdict] = Runner(
        concurrency=CONCURRENCY, finish=partial(record, ledger)
    )
    try:
        runner.start()

        async def open_client() -> httpx.AsyncClient:
            return httpx.AsyncClient()

        client = runner.call(open_client)
        setup = ConversationSetup(
            backend_url=url,
            token=TOKEN,
            endpoint_url=ENDPOINT,
            arm=ARM,
            snapshots=FakeSnapshots(),
            snapshot_wait_s=0.0,
        )
        for key in range(conversations):
            if not driver:
                runner.submit(key, partial(_bare_conversation, client, url, key))
                continue
            runner.submit(
                key,
                partial(
                    run_conversation,
                    client,
                    setup,
                    script=SCRIPT,
                    thread_id=f"thread-{key}",
                    transcript_path=workdir / "transcripts" / f"{key}.jsonl",
                ),
            )
        verdicts = [runner.wait(key) for key in range(conversations)]
        runner.call(client.aclose)
    finally:
        runner.close()
        os.close(ledger)
    elapsed = time.perf_counter() - started
    wrong = [v for v in verdicts if v is not Verdict.COMPLETED]
    if wrong:
        raise RuntimeError(f"{len(wrong)} conversations did not complete: {wrong[:3]}")
    return elapsed


# -- the raw side --------------------------------------------------------------------------


async def _bare_conversation(client: httpx.AsyncClient, url: str, key: int) -> None:
    """The script's turns as bare requests, each stream read to the end."""
    headers = {"Authorization": f"Bearer {TOKEN}"}
    for turn in SCRIPT.turns:
        body = {"query": turn.user, "thread_id": f"raw-{key}", "config": {}}
        async with client.stream("POST", url + STREAM_PATH, json=body, headers=headers) as response:
            async for _ in response.aiter_bytes():
                pass


async def _raw(url: str, conversations: int) -> None:
    semaphore = asyncio.Semaphore(CONCURRENCY)
    async with httpx.AsyncClient() as client:

        async def converse(key: int) -> None:
            async with semaphore:
                await _bare_conversation(client, url, key)

        await asyncio.gather(*(converse(key) for key in range(conversations)))


def run_raw(url: str, workdir: Path, conversations: int) -> float:
    started = time.perf_counter()
    asyncio.run(_raw(url, conversations))
    return time.perf_counter() - started


# -- main ----------------------------------------------------------------------------------

SIDES: dict[str, Callable[[str, Path, int], float]] = {
    "harness (Runner + driver)": run_runner,
    "raw (asyncio + httpx)": run_raw,
    "Runner + bare requests": partial(run_runner, driver=False),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--stub", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.stub:
        asyncio.run(_serve())
        return
    figures: dict[str, list[float]] = {name: [] for name in SIDES}
    # This process's CPU (every thread; the stub is another process): at 16 in
    # flight, each side's per-turn CPU is what its time exceeds the ideal by.
    cpu: dict[str, list[float]] = {name: [] for name in SIDES}
    stub, url = start_stub()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for name, side in SIDES.items():
                side(url, Path(tmp) / f"warm-up-{len(name)}", CONCURRENCY)
            names = list(SIDES)
            for repeat in range(args.repeats):
                # Rotate the order, so a drift in the machine's load hits every side.
                for name in names[repeat % 3 :] + names[: repeat % 3]:
                    workdir = Path(tmp) / f"r{repeat}-{names.index(name)}"
                    started = time.process_time()
                    figures[name].append(SIDES[name](url, workdir, CONVERSATIONS))
                    cpu[name].append(time.process_time() - started)
    finally:
        stub.terminate()
        stub.wait(10)
    ideal = CONVERSATIONS * TURNS * TURN_S / CONCURRENCY
    floor = math.ceil(CONVERSATIONS / CONCURRENCY) * TURNS * TURN_S
    print(
        f"{CONVERSATIONS} conversations x {TURNS} turns of {TURN_S * 1000:.0f} ms, "
        f"{CONCURRENCY} in flight (medians of {args.repeats})"
    )
    print(f"  ideal {ideal:.3f} s; floor with whole waves {floor:.3f} s")
    medians = {name: statistics.median(values) for name, values in figures.items()}
    for name, values in figures.items():
        m = medians[name]
        turn_ms = statistics.median(cpu[name]) / (CONVERSATIONS * TURNS) * 1000
        print(
            f"  {name:27} {m:.3f} s ({m / ideal:.2f} x ideal)  {_all(values)}"
            f"  cpu {turn_ms:.2f} ms/turn"
        )
    harness, raw, bare = medians.values()
    print(f"  ratio harness/raw {harness / raw:.3f} (target <= 1.05)")
    print(f"  ratio Runner-bare/raw {bare / raw:.3f} (the runner alone, without the driver)")


def _all(figures: list[float]) -> str:
    return "[" + ", ".join(f"{f:.3f}" for f in figures) + "]"


if __name__ == "__main__":
    main()
