"""The format of a run's `runs/<run_id>/model-metrics.csv`: one row per sample of the model
server's `/metrics` (the runner's sampler writes it, the report reads it)."""

from __future__ import annotations

import csv
import io
from dataclasses import astuple, dataclass, fields

FILE_NAME = "model-metrics.csv"


@dataclass(frozen=True)
class Sample:
    t_s: float
    running: float | None
    waiting: float | None
    kv_cache_usage: float | None
    prompt_tokens: float | None
    generation_tokens: float | None
    in_flight: int
    queued: int
    backend_cpu_s: float | None
    client_cpu_s: float


COLUMNS = tuple(f.name for f in fields(Sample))


def _fmt(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.3f}".rstrip("0").rstrip(".")
    return str(value)


def csv_line(sample: Sample) -> bytes:
    return (",".join(_fmt(v) for v in astuple(sample)) + "\n").encode()


def read_csv(text: str) -> list[Sample]:
    """The samples of the file's text; a damaged row raises ValueError, KeyError or
    TypeError (the reader names the file)."""

    def num(raw: str) -> float | None:
        return float(raw) if raw else None

    rows = list(csv.DictReader(io.StringIO(text)))
    return [
        Sample(
            t_s=float(r["t_s"]),
            running=num(r["running"]),
            waiting=num(r["waiting"]),
            kv_cache_usage=num(r["kv_cache_usage"]),
            prompt_tokens=num(r["prompt_tokens"]),
            generation_tokens=num(r["generation_tokens"]),
            in_flight=int(r["in_flight"]),
            queued=int(r["queued"]),
            backend_cpu_s=num(r["backend_cpu_s"]),
            client_cpu_s=float(r["client_cpu_s"]),
        )
        for r in rows
    ]
