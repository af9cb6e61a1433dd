"""The model's own utilisation, sampled from its `/metrics` (vLLM's names; the stand-in
exposes the same) into `runs/<run_id>/model-metrics.csv` (its format: `ledger.model_metrics`),
and the summary of it: the share of conversing time the model had nothing running while
items remained, and the bottleneck.

The interval is 1 s: fine enough to resolve idle shares of multi-minute runs to about a
percent, and cheap (one loopback GET and a /proc read per second, well under 1% of a core)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import httpx

from pytest_haico import httpclient
from pytest_haico.files import DEFAULT_FILE_MODE, append_line
from pytest_haico.ledger.model_metrics import COLUMNS, Sample, csv_line
from pytest_haico.procfs import read_proc_stat
from pytest_haico.provenance.model_server import parse_metrics as parse_prometheus

INTERVAL_S = 1.0
NAMES = {
    "vllm:num_requests_running": "running",
    "vllm:num_requests_waiting": "waiting",
    "vllm:kv_cache_usage_perc": "kv_cache_usage",
    "vllm:prompt_tokens_total": "prompt_tokens",
    "vllm:generation_tokens_total": "generation_tokens",
}
IDLE_LIMIT = 0.10  # idle more than this share of conversing time with items queued: say why
BUSY_CORE = 0.8  # a process using this share of a core or more is the bottleneck
# Fewer samples than this cannot resolve IDLE_LIMIT (one idle sample of 9 is already 11%).
MIN_SAMPLES = 10


def parse_metrics(text: str) -> dict[str, float]:
    """The sampled columns from Prometheus text, each summed over its labels (the
    provenance's parser: vLLM labels them by model and engine); an absent name is absent."""
    found = parse_prometheus(text.splitlines())
    return {column: found[name] for name, column in NAMES.items() if name in found}


def cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU of `pid` (and its reaped children) from /proc, or None."""
    if pid is None:
        return None
    stat = read_proc_stat(pid)
    if stat is None:
        return None
    return (stat.cpu_ticks + stat.children_cpu_ticks) / os.sysconf("SC_CLK_TCK")


def summarise(
    samples: Iterable[Sample],
    *,
    cap: int,
    window: tuple[float, float] | None,
    ramp_end: float | None = None,
) -> dict[str, Any]:
    """The utilisation over the samples taken while conversing (`window`: the first
    conversation's start and the last one's end, in the samples' time; None: none ran),
    after `ramp_end` under concurrency auto (its ramp up from 1 is auto's, not a bottleneck):
    the mean requests running, the share of samples where the model ran nothing while items
    remained (queued or in flight), and, where that share is over 10% of at least
    MIN_SAMPLES, the bottleneck: `backend` (its CPU near a core in those intervals), `client` (our
    own process's CPU near a core), `concurrency cap` (all `cap` conversations in flight),
    else `client` (conversations not admitted)."""
    begin, end = window if window is not None else (0.0, -1.0)
    if ramp_end is not None:
        begin = max(begin, ramp_end)
    everything = [s for s in samples if s.running is not None]
    inside = [i for i, s in enumerate(everything) if begin <= s.t_s <= end]
    rows = [everything[i] for i in inside]
    summary: dict[str, Any] = {"samples": len(rows)}
    if ramp_end is not None and window is not None:
        summary["ramp_s"] = round(max(0.0, min(ramp_end, end) - window[0]), 3)
    if not rows:
        return {**summary, "idle_share": None, "mean_running": None, "bottleneck": None}
    # Each interval ends at its sample; the first one inside starts at the sample before it.
    pairs = zip([everything[max(i - 1, 0)] for i in inside], rows, strict=True)
    idle = [(p, c) for p, c in pairs if c.running == 0 and (c.queued > 0 or c.in_flight > 0)]
    share = len(idle) / len(rows)
    enough = len(rows) >= MIN_SAMPLES
    return {
        **summary,
        # Fewer samples cannot tell 10% apart: no share, so that no reader judges one.
        "idle_share": round(share, 4) if enough else None,
        "mean_running": round(sum(s.running or 0.0 for s in rows) / len(rows), 3),
        "max_waiting": max(s.waiting or 0.0 for s in rows),
        "bottleneck": _bottleneck(idle, cap=cap) if enough and share > IDLE_LIMIT else None,
    }


def _rate(pairs: list[tuple[Sample, Sample]], key: Callable[[Sample], float | None]) -> float:
    spent = elapsed = 0.0
    for prev, cur in pairs:
        a, b = key(prev), key(cur)
        if a is not None and b is not None and cur.t_s > prev.t_s:
            spent += b - a
            elapsed += cur.t_s - prev.t_s
    return spent / elapsed if elapsed > 0 else 0.0


def _bottleneck(idle: list[tuple[Sample, Sample]], *, cap: int) -> str:
    if _rate(idle, lambda s: s.backend_cpu_s) >= BUSY_CORE:
        return "backend"
    if _rate(idle, lambda s: s.client_cpu_s) >= BUSY_CORE:
        return "client"
    at_cap = sum(1 for _, cur in idle if cur.in_flight >= cap)
    return "concurrency cap" if at_cap * 2 >= len(idle) else "client"


def summary_line(summary: Mapping[str, Any]) -> str | None:
    """The run's line on the model's utilisation; None when no sample fell while conversing."""
    if not summary.get("samples"):
        return None
    ramp = summary.get("ramp_s")
    after = f"after auto's {ramp:.1f} s ramp" if ramp else ""
    share = summary.get("idle_share")
    if summary["samples"] < MIN_SAMPLES or share is None:
        counted = f"{summary['samples']}, {after}" if after else str(summary["samples"])
        return f"model idle: too few samples ({counted}) to name a bottleneck"
    after = f" ({after})" if after else ""
    line = f"model idle {share:.0%} of conversing time{after} with items remaining"
    line += f", {summary['mean_running']:g} requests running on average"
    if summary.get("bottleneck"):
        line += f"; bottleneck: {summary['bottleneck']}"
    return line


class Sampler:
    """Samples `url` every INTERVAL_S on a daemon thread, appending to `path`, and hands each
    sample to `on_sample` (concurrency auto)."""

    def __init__(
        self,
        url: str,
        path: Path,
        *,
        state: Callable[[], tuple[int, int]],
        backend_pid: Callable[[], int | None] = lambda: None,
        on_sample: Callable[[Sample], None] = lambda sample: None,
        interval_s: float = INTERVAL_S,
        file_mode: int = DEFAULT_FILE_MODE,
    ) -> None:
        self.url, self.path, self._state, self._backend_pid = url, path, state, backend_pid
        self._on_sample = on_sample
        self._interval, self._mode = interval_s, file_mode
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="haico-model-metrics", daemon=True)
        self._t0 = time.monotonic()
        self.started_at = time.time()  # the wall clock at t_s = 0
        self.samples: list[Sample] = []

    def start(self) -> None:
        append_line(self.path, (",".join(COLUMNS) + "\n").encode(), mode=self._mode)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def sample_once(self, client: httpx.Client) -> Sample:
        try:
            found = parse_metrics(client.get(self.url).text)
        except httpx.HTTPError:
            found = {}
        in_flight, queued = self._state()
        times = os.times()
        sample = Sample(
            t_s=round(time.monotonic() - self._t0, 3),
            running=found.get("running"),
            waiting=found.get("waiting"),
            kv_cache_usage=found.get("kv_cache_usage"),
            prompt_tokens=found.get("prompt_tokens"),
            generation_tokens=found.get("generation_tokens"),
            in_flight=in_flight,
            queued=queued,
            backend_cpu_s=cpu_seconds(self._backend_pid()),
            client_cpu_s=round(times.user + times.system, 3),
        )
        self.samples.append(sample)
        self._on_sample(sample)
        append_line(self.path, csv_line(sample), mode=self._mode)
        return sample

    def _run(self) -> None:
        """One sample at once, then one each interval until stopped."""
        with httpclient.client(timeout=self._interval) as client:
            while True:
                try:
                    self.sample_once(client)
                except OSError:
                    return  # the run directory went away: the run is ending
                if self._stop.wait(self._interval):
                    return
