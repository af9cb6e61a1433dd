"""The model-metrics sampler's parsing, CSV and idle/bottleneck summary (no services)."""

from __future__ import annotations

import pytest

from pytest_haico.ledger.model_metrics import COLUMNS, Sample, csv_line, read_csv
from pytest_haico.runner.adaptive import AdaptiveConcurrency
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
ALL = (0.0, 1000.0)


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
    assert read_csv(text) == ([sample], 0)


def test_a_row_a_killed_sampler_left_unfinished_is_skipped_and_counted() -> None:
    first, later = (Sample(t, 1.0, 0.0, 0.5, 10.0, 3.0, 4, 7, None, 0.25) for t in (1.0, 3.0))
    whole = csv_line(first).decode()
    # What append_line leaves after a kill mid-line: the torn row, then the next on its own.
    text = ",".join(COLUMNS) + "\n" + whole + whole[:9] + "\n" + csv_line(later).decode()
    assert read_csv(text) == ([first, later], 1)
    with pytest.raises(ValueError, match="its header is not t_s,running,"):
        read_csv("t_s,runn\n" + whole)


def test_a_busy_model_names_no_bottleneck() -> None:
    summary = summarise([_s(t, 2.0) for t in range(20)], cap=4, window=ALL)
    assert summary["idle_share"] == 0.0 and summary["bottleneck"] is None


def test_idle_with_the_backend_at_a_core_names_the_backend() -> None:
    rows = [_s(t, 0.0 if t % 2 else 1.0, backend=0.95 * t) for t in range(20)]
    summary = summarise(rows, cap=4, window=ALL)
    assert summary["idle_share"] == 0.5 and summary["bottleneck"] == "backend"
    assert "bottleneck: backend" in (summary_line(summary) or "")


def test_idle_with_every_slot_in_flight_names_the_concurrency_cap() -> None:
    rows = [_s(t, 0.0 if t % 3 == 0 else 1.0, in_flight=4, backend=0.1 * t) for t in range(30)]
    assert summarise(rows, cap=4, window=ALL)["bottleneck"] == "concurrency cap"


def test_idle_with_the_client_at_a_core_names_the_client() -> None:
    rows = [_s(t, 0.0, in_flight=1, client=0.9 * t) for t in range(10)]
    assert summarise(rows, cap=4, window=ALL)["bottleneck"] == "client"


def test_idle_with_nothing_left_to_do_is_not_idle() -> None:
    rows = [_s(t, 0.0, in_flight=0, queued=0) for t in range(10)]
    assert summarise(rows, cap=4, window=ALL)["idle_share"] == 0.0


def test_only_samples_inside_the_conversing_window_count() -> None:
    # Idle with items queued before the first conversation started (the stack's last
    # seconds, the collection) and after the last ended: outside the window, not counted.
    rows = [_s(t, 2.0 if 5 <= t <= 24 else 0.0, in_flight=1, client=0.9 * t) for t in range(30)]
    summary = summarise(rows, cap=4, window=(5.0, 24.0))
    assert summary["samples"] == 20
    assert summary["idle_share"] == 0.0 and summary["bottleneck"] is None
    assert summarise(rows, cap=4, window=None)["samples"] == 0


def test_too_few_samples_name_no_bottleneck_and_no_idle_share() -> None:
    # Two samples of an idle model: no share a report could sum as "model idle 100%".
    rows = [_s(t, 0.0, in_flight=4) for t in range(3)]
    summary = summarise(rows, cap=4, window=(1.0, 2.0))
    assert summary["samples"] == 2 and summary["idle_share"] is None
    assert summary["bottleneck"] is None
    assert summary_line(summary) == "model idle: too few samples (2) to name a bottleneck"
    ramped = summarise(rows, cap=4, window=(0.0, 2.0), ramp_end=0.5)
    assert summary_line(ramped) == (
        "model idle: too few samples (2, after auto's 0.5 s ramp) to name a bottleneck"
    )


def _ramp() -> tuple[list[Sample], AdaptiveConcurrency]:
    """Auto's slow start 1, 2, 4, 8 over the first 4 samples (idle at each target), then
    the model busy at 8 of 16 for 20 samples."""
    clock = [0.0]
    auto = AdaptiveConcurrency(initial=1, maximum=16, clock=lambda: clock[0])
    rows = []
    for t in range(24):
        ramping = t < 4
        sample = _s(t, 0.0 if ramping else 6.0, in_flight=auto.target)
        rows.append(sample)
        clock[0] = t + 0.01
        if ramping:
            auto.observe(Sample(t, 1.0, 0.0, 0.1, 0, 0, auto.target, 50, None, 0.0))
    return rows, auto


def test_autos_ramp_is_left_out_of_the_judgement() -> None:
    rows, auto = _ramp()
    assert [a.new for a in auto.adaptations] == [2, 4, 8, 16]
    assert auto.ramp_end() == 3.01
    without = summarise(rows, cap=16, window=ALL)
    assert without["bottleneck"] == "client"  # the ramp misread as conversations not admitted
    summary = summarise(rows, cap=16, window=ALL, ramp_end=auto.ramp_end())
    assert summary["samples"] == 20 and summary["ramp_s"] == 3.01
    assert summary["idle_share"] == 0.0 and summary["bottleneck"] is None
    assert summary_line(summary) == (
        "model idle 0% of conversing time (after auto's 3.0 s ramp) with items remaining, "
        "6 requests running on average"
    )


def test_the_ramp_ends_at_the_first_change_that_is_not_a_doubling() -> None:
    auto = AdaptiveConcurrency(initial=1, maximum=16, clock=iter([7.0, 8.0, 9.0]).__next__)
    assert auto.ramp_end() is None
    room = Sample(0, 1.0, 0.0, 0.1, 0, 0, 1, 50, None, 0.0)
    auto.observe(room)  # 1 -> 2 at 7.0
    auto.observe(Sample(1, 2.0, 3.0, 0.1, 0, 0, 2, 50, None, 0.0))  # waiting: 2 -> 1
    auto.observe(room)  # 1 -> 2 again, after the overload: no longer the ramp
    assert [a.new for a in auto.adaptations] == [2, 1, 2]
    assert auto.ramp_end() == 7.0
