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


def read_csv(text: str) -> tuple[list[Sample], int]:
    """The samples of the file's text, and how many rows were damaged and skipped (a line a
    killed sampler left unfinished: the next one starts on a line of its own). A header
    without the columns raises ValueError (the reader names the file)."""
    reader = csv.DictReader(io.StringIO(text))
    if reader.fieldnames is not None and not set(COLUMNS) <= set(reader.fieldnames):
        raise ValueError(f"its header is not {','.join(COLUMNS)}")
    samples: list[Sample] = []
    damaged = 0
    for row in reader:
        try:
            samples.append(_sample(row))
        except (ValueError, TypeError):
            damaged += 1
    return samples, damaged


def _sample(row: dict[str, str]) -> Sample:
    def num(raw: str) -> float | None:
        return float(raw) if raw else None

    return Sample(
        t_s=float(row["t_s"]),
        running=num(row["running"]),
        waiting=num(row["waiting"]),
        kv_cache_usage=num(row["kv_cache_usage"]),
        prompt_tokens=num(row["prompt_tokens"]),
        generation_tokens=num(row["generation_tokens"]),
        in_flight=int(row["in_flight"]),
        queued=int(row["queued"]),
        backend_cpu_s=num(row["backend_cpu_s"]),
        client_cpu_s=float(row["client_cpu_s"]),
    )
