"""The stand-in engine's scheduler and counters, and ``/metrics`` in vLLM's Prometheus names."""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass

from pytest_haico.standins.vllm_versions import VllmVersion

# vLLM's default KV-cache block size, in tokens.
BLOCK_SIZE = 16
# vLLM's FinishReason values; its Prometheus logger creates a series for each up front.
FINISH_REASONS = ("stop", "length", "abort")
# What vLLM's /metrics answers with (prometheus_client's text format).
METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class RunningRequest:
    """One request while the engine holds it: the KV-cache blocks of its tokens."""

    def __init__(self, stats: EngineStats, prompt_tokens: int) -> None:
        self._stats = stats
        self.tokens = prompt_tokens

    @property
    def blocks(self) -> int:
        return math.ceil(self.tokens / BLOCK_SIZE)

    def finish(self, generated_tokens: int, finish_reason: str) -> None:
        """The request generated *generated_tokens* and finished (engine reason stop/length)."""
        self.tokens += generated_tokens
        self._stats.generation_tokens += generated_tokens
        self._stats.finished[finish_reason] += 1


class EngineStats:
    """A scheduler of at most ``max_num_seqs`` running requests, and what vLLM counts of it.

    A request waits for a free sequence slot (``num_requests_waiting``), then runs
    (``num_requests_running``) from its prefill until its reply is complete, holding KV-cache
    blocks for its tokens. The stand-in has no memory pressure, so it never preempts.
    """

    def __init__(self, *, max_num_seqs: int, max_model_len: int) -> None:
        self.max_num_seqs = max_num_seqs
        # Enough for every slot to hold a full-length sequence, as vLLM checks at start-up.
        self.num_gpu_blocks = math.ceil(max_model_len / BLOCK_SIZE) * max_num_seqs
        self.waiting = 0
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.preemptions = 0
        self.finished: Counter[str] = Counter()
        self._running: list[RunningRequest] = []
        self._slots = asyncio.Semaphore(max_num_seqs)

    @property
    def running(self) -> int:
        return len(self._running)

    @property
    def kv_cache_usage(self) -> float:
        """The share of KV-cache blocks the running requests hold (1 is full)."""
        used = sum(s.blocks for s in self._running)
        return used / self.num_gpu_blocks

    @contextlib.asynccontextmanager
    async def schedule(self, prompt_tokens: int) -> AsyncIterator[RunningRequest]:
        """Wait for a slot, prefill *prompt_tokens*, and hold the request while it runs."""
        self.waiting += 1
        try:
            await self._slots.acquire()
        finally:
            self.waiting -= 1
        request = RunningRequest(self, prompt_tokens)
        self.prompt_tokens += prompt_tokens
        self._running.append(request)
        try:
            yield request
        finally:
            self._running.remove(request)
            self._slots.release()


@dataclass(frozen=True)
class _Metric:
    name: str
    kind: str
    help: str
    samples: tuple[tuple[dict[str, str], float], ...]


def render_metrics(stats: EngineStats, *, model_name: str, version: VllmVersion) -> str:
    """``GET /metrics``: Prometheus text with vLLM's names, labels and help texts."""
    labels = {"engine": "0", "model_name": model_name}

    def one(name: str, kind: str, help_text: str, value: float) -> _Metric:
        return _Metric(name, kind, help_text, ((labels, value),))

    cache_info = {
        "block_size": str(BLOCK_SIZE),
        "cache_dtype": "auto",
        "enable_prefix_caching": "True",
        "engine": "0",
        "gpu_memory_utilization": "0.9",
        "num_cpu_blocks": "None",
        "num_gpu_blocks": str(stats.num_gpu_blocks),
    }
    usage = stats.kv_cache_usage
    metrics = [
        _Metric(
            "vllm:cache_config_info",
            "gauge",
            "Information of the LLMEngine CacheConfig",
            ((cache_info, 1.0),),
        ),
        one(
            "vllm:num_requests_running",
            "gauge",
            "Number of requests in model execution batches.",
            stats.running,
        ),
        one(
            "vllm:num_requests_waiting",
            "gauge",
            "Number of requests waiting to be processed.",
            stats.waiting,
        ),
    ]
    if version.shows_gpu_cache_usage:
        gpu_help = "GPU KV-cache usage. 1 means 100 percent usage."
        if version.shows_kv_cache_usage:
            gpu_help += "DEPRECATED: Use vllm:kv_cache_usage_perc instead."
        metrics.append(one("vllm:gpu_cache_usage_perc", "gauge", gpu_help, usage))
    if version.shows_kv_cache_usage:
        kv_help = "KV-cache usage. 1 means 100 percent usage."
        metrics.append(one("vllm:kv_cache_usage_perc", "gauge", kv_help, usage))
    metrics += [
        one(
            "vllm:num_preemptions_total",
            "counter",
            "Cumulative number of preemption from the engine.",
            stats.preemptions,
        ),
        one(
            "vllm:prompt_tokens_total",
            "counter",
            "Number of prefill tokens processed.",
            stats.prompt_tokens,
        ),
        one(
            "vllm:generation_tokens_total",
            "counter",
            "Number of generation tokens processed.",
            stats.generation_tokens,
        ),
        _Metric(
            "vllm:request_success_total",
            "counter",
            "Count of successfully processed requests.",
            tuple(
                ({**labels, "finished_reason": reason}, stats.finished[reason])
                for reason in FINISH_REASONS
            ),
        ),
    ]
    return "".join(_render(metric) for metric in metrics)


def _render(metric: _Metric) -> str:
    lines = [f"# HELP {metric.name} {metric.help}", f"# TYPE {metric.name} {metric.kind}"]
    for labels, value in metric.samples:
        # Sorted label names, as prometheus_client's multiprocess collector (vLLM's) writes.
        pairs = ",".join(f'{key}="{_escape(labels[key])}"' for key in sorted(labels))
        lines.append(f"{metric.name}{{{pairs}}} {float(value)!r}")
    return "\n".join(lines) + "\n"


def _escape(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
