"""Concurrency `auto` against fixed concurrencies on real vLLM 0.32 (the test tier's, CPU).

Run: python benchmarks/real_vllm_auto.py [--conversations N] [--rounds R] [--max-tokens T]

One vLLM, started once. Each round runs the same N conversations x 2 turns as a campaign
(pytest on the local profile, --haico-model-endpoint to that vLLM; see real_vllm.py) at
fixed 1, fixed 4, fixed 8 and auto (1 to 8), in an order rotated each round so that load
drift moves every setting alike. Per setting: the median campaign span (first
conversation's start to last one's end, from the ledger), its ratio to the baseline fixed 8
(auto's upper bound) measured in the same run, the share of the span vLLM had nothing
running (its own /metrics, sampled every second), and auto's adaptations from the run's
timeline.json. The load average is printed before each campaign.

Without the tier (python3 tests/vllm/setup_tier.py) it says so and measures nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import sys
import tempfile
from pathlib import Path

from real_vllm import RunningSampler, Span, conversations, run_harness

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.vllm.real_vllm import running_vllms, tier_arm
from tests.vllm.setup_tier import SETUP_COMMAND, read_manifest, tier_dir

MAX_CONCURRENCY = 8
BASELINE = f"fixed {MAX_CONCURRENCY}"
SETTINGS: dict[str, int | str] = {"fixed 1": 1, "fixed 4": 4, BASELINE: MAX_CONCURRENCY}
SETTINGS["auto"] = "auto"
TURNS = 2


def _adaptations(root: Path) -> str:
    """auto's course in the campaign's timeline.json, e.g. `1→8, 4 adaptations`."""
    for path in (root / "results").rglob("runs/*/timeline.json"):
        section = json.loads(path.read_text()).get("concurrency") or {}
        if section.get("mode") == "auto":
            steps = len(section["adaptations"])
            return f"; auto {section['initial']}→{section['final']}, {steps} adaptations"
    return ""


def _report(spans: dict[str, list[Span]], sampler: RunningSampler, rounds: int) -> None:
    base = statistics.median(s.seconds for s in spans[BASELINE])
    print(f"median span over {rounds} rounds, ratio to {BASELINE} (lower is faster):")
    for name, runs in spans.items():
        median = statistics.median(s.seconds for s in runs)
        idle = statistics.median(sampler.idle_share(s)[0] for s in runs)
        print(f"  {name:>7}: {median:6.1f} s  {median / base:.2f}x  model idle {idle:4.0%}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--conversations", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=32)
    args = parser.parse_args()
    manifest = read_manifest()
    if manifest is None:
        print(f"real_vllm_auto: the tier is not set up in {tier_dir()}: run `{SETUP_COMMAND}`")
        return 0
    key = secrets.token_urlsafe(24)
    talks = conversations(args.conversations, TURNS)
    spans: dict[str, list[Span]] = {name: [] for name in SETTINGS}
    names = list(SETTINGS)
    print(
        f"{len(talks)} conversations x {TURNS} turns, max_tokens {args.max_tokens}, real vLLM "
        f"{manifest.vllm_version} (CPU); {os.cpu_count()} cores"
    )
    with tempfile.TemporaryDirectory(prefix="haico-bench-auto-") as tmp:
        arms = [tier_arm(manifest, "bench")]
        with running_vllms(manifest, root=Path(tmp), api_key=key, arms=arms) as (server,):
            url = server.base_url.replace("127.0.0.1", "vllm.localhost") + "/v1"
            with RunningSampler(server.base_url) as sampler:
                for round_ in range(args.rounds):
                    order = names[round_ % len(names) :] + names[: round_ % len(names)]
                    for name in order:
                        load = os.getloadavg()[0]
                        root = Path(tmp) / f"{name.replace(' ', '-')}-{round_}"
                        span = run_harness(
                            manifest, url=url, key=key, talks=talks, in_flight=SETTINGS[name],
                            max_tokens=args.max_tokens, root=root,
                            max_concurrency=MAX_CONCURRENCY,
                        )  # fmt: skip
                        spans[name].append(span)
                        idle, samples = sampler.idle_share(span)
                        print(
                            f"  round {round_ + 1} {name:>7}: span {span.seconds:6.1f} s, model "
                            f"idle {idle:4.0%} ({samples} samples), load {load:.1f} before"
                            f"{_adaptations(root)}",
                            flush=True,
                        )
                _report(spans, sampler, args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
