"""The walltime gate (10) over measured item times, and the output-collision gate (11)."""

from __future__ import annotations

from pathlib import Path

from pytest_haico.gates.static import check_output_collision, check_walltime


def test_enough_walltime_for_the_slowest_item_and_the_drain_passes() -> None:
    result = check_walltime(3600.0, 600.0, drain_margin_s=120.0, stratum="long")
    assert result.passed, result
    assert result.detail == (
        "the job ends in 1 h 0 min; the slowest item of stratum long took 10 min 0 s + 120 s "
        "drain margin = 12 min 0 s"
    )


def test_too_little_walltime_fails_with_the_time_to_ask_for() -> None:
    result = check_walltime(500.0, 600.0, drain_margin_s=120.0, stratum="long")
    assert result.failure_line == (
        "gate walltime failed: the job ends in 8 min 20 s; the slowest item of stratum long "
        "took 10 min 0 s + 120 s drain margin = 12 min 0 s: not even that item could finish; "
        "resubmit with a longer --time (at least 12 min 0 s; `haico cost` prints what to ask "
        "for), or select a cheaper stratum with --haico-stratum"
    )


def test_without_a_walltime_or_a_history_the_gate_passes() -> None:
    no_job = check_walltime(None, 600.0, drain_margin_s=120.0, stratum="long")
    assert (no_job.passed, no_job.detail) == (
        True,
        "no walltime: not in a Slurm job, or its end time is unknown",
    )
    first_run = check_walltime(30.0, None, drain_margin_s=120.0, stratum="long")
    assert (first_run.passed, first_run.detail) == (
        True,
        "no history: no measured item of stratum long yet",
    )


def test_a_share_this_run_claimed_passes() -> None:
    share = "arm demo, shard 0/2, stratum default"
    result = check_output_collision(claimed=True, share=share)
    assert (result.passed, result.detail) == (True, f"{share}: claimed by this run")


def test_a_share_another_live_run_holds_fails_naming_it_and_the_claim(tmp_path: Path) -> None:
    claim = tmp_path / "claims" / "shard-0of2.default.json"
    holder = "run 4242.1 (host gpu07, pid 123, Slurm job 4242, since 2026-12-01T10:00:00+00:00)"
    result = check_output_collision(
        claimed=False, share="arm demo, shard 0/2, stratum default", holder=holder,
        claim_path=claim,
    )  # fmt: skip
    assert result.failure_line == (
        f"gate output_collision failed: arm demo, shard 0/2, stratum default is being run by "
        f"{holder}: a second run would run its items again; let that run finish or cancel it "
        f"(scancel); if it is dead (e.g. its node failed), remove {claim}, then rerun"
    )
