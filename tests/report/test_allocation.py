"""The report's allocation totals: the timelines' own shares, summed over sessions (the arms
one pytest session ran share its allocation, counted once)."""

from __future__ import annotations

from typing import Any

from pytest_haico.report.allocation import RunAllocation, iter_totals


def _run(arm: str, session: str, *, starting: float, gpu: float | None) -> RunAllocation:
    shares: dict[str, Any] = {
        "allocation_s": 100.0,
        "gpu_hours": gpu,
        "starting": starting,
        "conversing": 0.5,
        "draining": 0.0,
        "dumping": 0.1,
    }
    return RunAllocation(arm, f"run-{session}", session=(session, 1.0), shares=shares)


def test_runs_of_one_session_count_its_allocation_once() -> None:
    runs = [
        _run("a", "s1", starting=0.2, gpu=0.4),
        _run("b", "s1", starting=0.1, gpu=0.4),  # the same session as a's run
        _run("b", "s2", starting=0.3, gpu=None),
        RunAllocation("c", "run-x", problems=["torn"]),  # no readable timeline: not counted
    ]
    got = {t.label: t for t in iter_totals(runs)}
    assert list(got) == ["a", "b", "campaign"]
    assert (got["b"].runs, got["b"].allocation_s, got["b"].gpu_hours) == (2, 200.0, 0.4)
    assert got["b"].shares["starting"] == (10 + 30) / 200
    campaign = got["campaign"]
    assert (campaign.runs, campaign.allocation_s, campaign.gpu_hours) == (3, 200.0, 0.4)
    assert campaign.shares == {
        "starting": (20 + 10 + 30) / 200,
        "conversing": 150 / 200,
        "draining": 0.0,
        "dumping": 30 / 200,
    }
    assert campaign.idle_share is None and "model idle" not in campaign.line()


def test_a_run_without_a_sample_while_conversing_leaves_the_idle_share_out() -> None:
    run = _run("a", "s1", starting=0.2, gpu=None)
    run.model = {"samples": 0, "idle_share": None, "mean_running": None, "bottleneck": None}
    busy = _run("b", "s2", starting=0.2, gpu=None)
    busy.model = {"samples": 20, "idle_share": 0.25, "mean_running": 3.0, "bottleneck": "client"}
    campaign = {t.label: t for t in iter_totals([run, busy])}["campaign"]
    assert (campaign.idle_share, campaign.bottlenecks) == (0.25, ("client",))
