"""The model-metrics sampler's parsing, CSV and idle/bottleneck summary (no services)."""

from __future__ import annotations

from pytest_haico.ledger.model_metrics import COLUMNS, Sample, csv_line, read_csv
from pytest_haico.runner.model_metrics import parse_metrics, summarise, summary_line

TEXT = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 1.0
vllm:num_requests_waiting{model_name="m"} 0.0
vllm:kv_cache_usage_perc{model_name="m"} 0.25
vllm:prompt_tokens_total{model_name="m"} 1200.0
vllm:generation_tokens_total{model_name="m"} 300.0
vllm:request_success_total{finished_reason="stop"} 9.0
"""


def _s(
    t: float,
    running: float,
    *,
    in_flight: int = 2,
    queued: int = 5,
    backend: float = 0.0,
    client: float = 0.0,
) -> Sample:
    return Sample(t, running, 0.0, 0.1, 0.0, 0.0, in_flight, queued, backend, client)


def test_parse_sums_over_labels_and_ignores_other_names() -> None:
    assert parse_metrics(TEXT) == {
        "running": 4.0,
        "waiting": 0.0,
        "kv_cache_usage": 0.25,
        "prompt_tokens": 1200.0,
        "generation_tokens": 300.0,
    }
    assert parse_metrics("garbage\nvllm:num_requests_running nan-ish\n") == {}


def test_csv_round_trips() -> None:
    sample = Sample(1.5, 2.0, None, 0.5, 10.0, 3.0, 4, 7, None, 0.25)
    text = ",".join(COLUMNS) + "\n" + csv_line(sample).decode()
    assert read_csv(text) == [sample]


def test_a_busy_model_names_no_bottleneck() -> None:
    summary = summarise([_s(t, 2.0) for t in range(20)], cap=4)
    assert summary["idle_share"] == 0.0 and summary["bottleneck"] is None


def test_idle_with_the_backend_at_a_core_names_the_backend() -> None:
    rows = [_s(t, 0.0 if t % 2 else 1.0, backend=0.95 * t) for t in range(20)]
    summary = summarise(rows, cap=4)
    assert summary["idle_share"] == 0.5 and summary["bottleneck"] == "backend"
    assert "bottleneck: backend" in (summary_line(summary) or "")


def test_idle_with_every_slot_in_flight_names_the_concurrency_cap() -> None:
    rows = [_s(t, 0.0 if t % 3 == 0 else 1.0, in_flight=4, backend=0.1 * t) for t in range(30)]
    assert summarise(rows, cap=4)["bottleneck"] == "concurrency cap"


def test_idle_with_the_client_at_a_core_names_the_client() -> None:
    rows = [_s(t, 0.0, in_flight=1, client=0.9 * t) for t in range(10)]
    assert summarise(rows, cap=4)["bottleneck"] == "client"


def test_idle_with_nothing_left_to_do_is_not_idle() -> None:
    rows = [_s(t, 0.0, in_flight=0, queued=0) for t in range(10)]
    assert summarise(rows, cap=4)["idle_share"] == 0.0
