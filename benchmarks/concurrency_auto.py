"""Concurrency `auto` against fixed concurrencies, through the full local stack.

Run: python benchmarks/concurrency_auto.py [--conversations N] [--repeats R] [--max-num-seqs S]

N conversations x 2 turns, 250 ms completions, on a stand-in model that runs at most S
requests at once (vLLM's --max-num-seqs; more wait, as on a full GPU). Each repeat runs
fixed 1, fixed S, fixed 16 and auto (1 to 16), in an order rotated each repeat so that load
drift moves every side alike. Per setting, the median campaign span (the first
conversation's start to the last one's end, from the ledger) and its ratio to the baseline,
fixed 16 (the arm bound auto has), measured in the same run; the most requests the model
had waiting at once, and auto's adaptations. The load average is printed before each run.
"""

from __future__ import annotations

import argparse
import os
import statistics
from typing import Any

from campaign import run

TURNS = 2
LATENCY_MS = 250
BASELINE = "fixed 16"  # the arms' default max_concurrency: auto's upper bound


def _settings(max_num_seqs: int) -> dict[str, int | str]:
    return {"fixed 1": 1, f"fixed {max_num_seqs}": max_num_seqs, BASELINE: 16, "auto": "auto"}


def _concurrency(timelines: list[dict[str, Any]]) -> str:
    doc = timelines[-1]
    section = doc.get("concurrency") or {}
    model = doc.get("model") or {}
    waiting = f"max waiting {model.get('max_waiting', float('nan')):g}"
    if section.get("mode") != "auto":
        return waiting
    count = len(section["adaptations"])
    return f"{waiting}; auto {section['initial']}→{section['final']}, {count} adaptations"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--conversations", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--max-num-seqs", type=int, default=4)
    args = parser.parse_args()
    settings = _settings(args.max_num_seqs)
    spans: dict[str, list[float]] = {name: [] for name in settings}
    names = list(settings)
    print(
        f"{args.conversations} conversations x {TURNS} turns, {LATENCY_MS} ms completions, "
        f"stand-in max_num_seqs {args.max_num_seqs}; {os.cpu_count()} cores"
    )
    for repeat in range(args.repeats):
        order = names[repeat % len(names) :] + names[: repeat % len(names)]
        for name in order:
            load = os.getloadavg()[0]
            result = run(
                args.conversations,
                settings[name],
                turns=TURNS,
                latency_ms=LATENCY_MS,
                # The [standin] section is the arm's last: its key first, then [run]'s bound.
                arm_extra=f"max_num_seqs = {args.max_num_seqs}\n",  # into [standin]
            )
            spans[name].append(result.span_s)
            print(
                f"  repeat {repeat + 1} {name:>9}: campaign {result.span_s:5.1f} s, load "
                f"{load:.1f} before; {_concurrency(result.timelines)} -- {result.summary}"
            )
    base = statistics.median(spans[BASELINE])
    print(
        f"median campaign span over {args.repeats} repeats, ratio to {BASELINE} (lower is faster):"
    )
    for name in names:
        median = statistics.median(spans[name])
        print(f"  {name:>9}: {median:5.1f} s  {median / base:.2f}x")


if __name__ == "__main__":
    main()
