"""Benchmark of the harness against real vLLM 0.32 (the test tier's, on CPUs), on one vLLM.

Run: python benchmarks/real_vllm.py [--rounds R] [--turns T] [--max-tokens N]

* vLLM's spawn to healthy: the one start, by the cluster profile's model service (the wait
  that watches its process and its log);
* the harness against a raw `openai` async client, as a ratio, at 1, 4 and 8 conversations
  in flight: the harness is a campaign of 2 x in-flight conversations (4 at the least) x T
  turns, run by pytest on the local profile with --haico-model-endpoint to that vLLM (the
  runner, the driver, the stand-in backend's LangGraph agent and ChatOpenAI, Postgres); its
  span runs from the first conversation's start to the last one's end (the ledger's times:
  the stack's start-up is left out). The raw side sends the same conversations straight to
  vLLM with `openai.AsyncOpenAI`: the same turns, the backend's tool, max_tokens and
  temperature, streamed with usage, as many at a time. R rounds, the sides' order alternating
  (A/B interleaved), medians. The model writes what it writes, so the ratio is given per
  generated token too;
* the share of each span the model had nothing running: `vllm:num_requests_running` from
  vLLM's own /metrics, sampled about every second.

Without the tier (python3 tests/vllm/setup_tier.py) it says so and measures nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, cast

import httpx
import openai
from langchain_core.utils.function_calling import convert_to_openai_tool

from pytest_haico.provenance.model_server import parse_metrics
from pytest_haico.standins.agent import write_document

# The tier's set-up and its vLLM start live with the tests (tests/vllm/); this file runs as a
# script, so the repository's root is put on the path for them.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.harness import CONVERSATION_MODULE, PYPROJECT
from tests.vllm.real_vllm import MAX_MODEL_LEN, running_vllms, tier_arm
from tests.vllm.setup_tier import SETUP_COMMAND, Manifest, read_manifest, tier_dir

IN_FLIGHT = (1, 4, 8)
SAMPLE_EVERY_S = 1.0
PLACES = ("Crete", "Lisbon", "Kyoto", "Quito", "Oslo", "Dakar", "Hobart", "Lima")
TOOL = convert_to_openai_tool(write_document)


@dataclass(frozen=True)
class Span:
    """One side's conversations: when they ran (epoch seconds) and what the model wrote."""

    start: float
    end: float
    tokens_out: int

    @property
    def seconds(self) -> float:
        return self.end - self.start


class RunningSampler:
    """``vllm:num_requests_running`` from /metrics about every second, in a thread."""

    def __init__(self, base_url: str) -> None:
        self._url = f"{base_url}/metrics"
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="metrics", daemon=True)

    def __enter__(self) -> RunningSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _sample(self) -> None:
        with httpx.Client(timeout=5.0, trust_env=False) as client:
            while not self._stop.wait(SAMPLE_EVERY_S):
                try:
                    text = client.get(self._url).text
                except httpx.HTTPError:
                    continue
                running = parse_metrics(text.splitlines()).get("vllm:num_requests_running")
                if running is not None:
                    self.samples.append((time.time(), running))

    def idle_share(self, span: Span) -> tuple[float, int]:
        """The share of the span's samples with nothing running, and how many there were."""
        inside = [running for at, running in self.samples if span.start <= at <= span.end]
        if not inside:
            return float("nan"), 0
        return sum(1 for running in inside if running == 0) / len(inside), len(inside)


def conversations(count: int, turns: int) -> list[list[str]]:
    """`count` conversations of `turns` user turns each, asking about places (each its own:
    a campaign refuses two scripts with the same turns)."""
    talks = []
    for i in range(count):
        place, nth = PLACES[i % len(PLACES)], i // len(PLACES) + 1
        first = f"Tell me fact number {nth} about {place}."
        talks.append([first] + [f"And one more fact about {place}, please."] * (turns - 1))
    return talks


def _epoch(stamp: str) -> float:
    return datetime.fromisoformat(stamp).timestamp()


def run_harness(
    manifest: Manifest, *, url: str, key: str, talks: list[list[str]], in_flight: int | str,
    max_tokens: int, root: Path, max_concurrency: int | None = None,
) -> Span:  # fmt: skip
    """The conversations as a campaign: pytest on the local profile, the model at `url`
    (`in_flight` "auto": adapted, up to `max_concurrency`)."""
    bound = f"max_concurrency = {max_concurrency}\n" if max_concurrency else ""
    experiments = root / "experiments"
    (experiments / "arms").mkdir(parents=True)
    (experiments / "scripts").mkdir()
    (root / "pyproject.toml").write_text(PYPROJECT)
    (experiments / "test_conversations.py").write_text(CONVERSATION_MODULE)
    (experiments / "arms" / "bench.toml").write_text(
        f'[model]\nserved_name = "{manifest.served_name}"\n'
        f"[vllm]\nmax_model_len = {MAX_MODEL_LEN}\n"
        f"[generation]\nmax_tokens = {max_tokens}\n"
        f"[run]\nconcurrency = {json.dumps(in_flight)}\n{bound}turn_timeout_s = 600\n"
    )
    scripts = [
        json.dumps({"id": f"c{i:03d}", "turns": [{"user": text} for text in talk]})
        for i, talk in enumerate(talks)
    ]
    (experiments / "scripts" / "bench.jsonl").write_text("\n".join(scripts) + "\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_HAICO_", "SLURM_"))}
    env["HAICO_MODEL_API_KEY"] = key
    argv = [sys.executable, "-m", "pytest", "experiments", "-q", "-p", "no:cacheprovider"]
    argv += ["--haico-model-endpoint", url, "--haico-results", str(root / "results")]
    done = subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True, check=False)
    if done.returncode not in (0, 1):  # 1: a verdict the small model earned
        raise RuntimeError(
            f"the campaign exited {done.returncode}:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
        )
    records = [
        json.loads(line)
        for path in (root / "results").glob("default/bench/ledger/*.jsonl")
        for line in path.read_text().splitlines()
    ]
    if len(records) != len(talks):
        raise RuntimeError(f"{len(records)} records of {len(talks)}:\n{done.stdout[-3000:]}")
    return Span(
        start=min(_epoch(r["started_at"]) for r in records),
        end=max(_epoch(r["finished_at"]) for r in records),
        tokens_out=sum(t.get("tokens_out") or 0 for r in records for t in r["turns"]),
    )


async def _raw(
    base_url: str, key: str, model: str, talks: list[list[str]], in_flight: int, max_tokens: int
) -> int:
    semaphore = asyncio.Semaphore(in_flight)
    http = httpx.AsyncClient(timeout=httpx.Timeout(600.0, connect=10.0), trust_env=False)
    # openai 3 types its client as httpx2's; httpx's works the same.
    client = openai.AsyncOpenAI(
        base_url=f"{base_url}/v1", api_key=key, max_retries=0, http_client=cast(Any, http)
    )

    async def converse(talk: list[str]) -> int:
        messages: list[dict[str, Any]] = []
        written = 0
        async with semaphore:
            for text in talk:
                messages.append({"role": "user", "content": text})
                stream = await client.chat.completions.create(
                    model=model,
                    messages=cast(Any, messages),
                    tools=cast(Any, [TOOL]),
                    max_tokens=max_tokens,
                    temperature=0.0,
                    stream=True,
                    stream_options={"include_usage": True},
                )
                answer = []
                async for chunk in stream:
                    if chunk.choices and chunk.choices[0].delta.content:
                        answer.append(chunk.choices[0].delta.content)
                    if chunk.usage is not None:
                        written += chunk.usage.completion_tokens
                messages.append({"role": "assistant", "content": "".join(answer)})
        return written

    try:
        return sum(await asyncio.gather(*(converse(talk) for talk in talks)))
    finally:
        await client.close()


def run_raw(
    manifest: Manifest, *, base_url: str, key: str, talks: list[list[str]], in_flight: int,
    max_tokens: int,
) -> Span:  # fmt: skip
    start = time.time()
    written = asyncio.run(_raw(base_url, key, manifest.served_name, talks, in_flight, max_tokens))
    return Span(start=start, end=time.time(), tokens_out=written)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--turns", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=48)
    args = parser.parse_args()
    manifest = read_manifest()
    if manifest is None:
        print(
            f"real_vllm: the real-vLLM tier is not set up in {tier_dir()}: run "
            f"`{SETUP_COMMAND}`; nothing measured"
        )
        return 0
    key = secrets.token_urlsafe(24)
    with tempfile.TemporaryDirectory(prefix="haico-bench-vllm-") as tmp:
        started = time.monotonic()
        arms = [tier_arm(manifest, "bench")]
        with running_vllms(manifest, root=Path(tmp), api_key=key, arms=arms) as (server,):
            print(
                f"real vLLM {manifest.vllm_version} (the tier's, CPU): spawn to healthy "
                f"{server.healthy_after_s:.1f} s (one start; {time.monotonic() - started:.1f} s "
                "with the service's set-up)",
                flush=True,
            )
            url = server.base_url.replace("127.0.0.1", "vllm.localhost") + "/v1"
            with RunningSampler(server.base_url) as sampler:
                for in_flight in IN_FLIGHT:
                    talks = conversations(max(4, 2 * in_flight), args.turns)
                    spans: dict[str, list[Span]] = {"harness": [], "raw": []}
                    for round_ in range(args.rounds):
                        order = ("harness", "raw") if round_ % 2 == 0 else ("raw", "harness")
                        for side in order:
                            if side == "harness":
                                span = run_harness(
                                    manifest, url=url, key=key, talks=talks, in_flight=in_flight,
                                    max_tokens=args.max_tokens,
                                    root=Path(tmp) / f"campaign-{in_flight}-{round_}",
                                )  # fmt: skip
                            else:
                                span = run_raw(
                                    manifest, base_url=server.base_url, key=key, talks=talks,
                                    in_flight=in_flight, max_tokens=args.max_tokens,
                                )  # fmt: skip
                            spans[side].append(span)
                    report(in_flight, len(talks), args.turns, spans, sampler)
    return 0


def report(
    in_flight: int, count: int, turns: int, spans: dict[str, list[Span]], sampler: RunningSampler
) -> None:
    """One block of figures: the spans, their ratio (also per generated token), idle shares."""
    seconds = {side: statistics.median(s.seconds for s in runs) for side, runs in spans.items()}
    per_token = {
        side: statistics.median(s.seconds / max(s.tokens_out, 1) for s in runs)
        for side, runs in spans.items()
    }
    tokens = {side: statistics.median(s.tokens_out for s in runs) for side, runs in spans.items()}
    print(f"{in_flight} in flight: {count} conversations x {turns} turns, medians of "
          f"{len(spans['harness'])} rounds")  # fmt: skip
    for side, runs in spans.items():
        shares = [sampler.idle_share(span) for span in runs]
        idle = statistics.median(share for share, _ in shares)
        samples = sum(n for _, n in shares)
        print(
            f"  {side:8} span {seconds[side]:6.1f} s  {tokens[side]:6.0f} tokens out  "
            f"{per_token[side] * 1000:6.1f} ms/token  model idle {idle:4.0%} "
            f"({samples} samples)  spans [{', '.join(f'{s.seconds:.1f}' for s in runs)}]"
        )
    print(
        f"  ratio harness/raw {seconds['harness'] / seconds['raw']:.2f}; per generated token "
        f"{per_token['harness'] / per_token['raw']:.2f}",
        flush=True,
    )


if __name__ == "__main__":
    sys.exit(main())
