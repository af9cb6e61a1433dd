"""Walltime admission against real Slurm daemons: the end time read, and moved by an admin."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime

import pytest

from pytest_haico.runner.walltime import JobEndTime, WalltimeAdmission
from pytest_haico.slurm import client
from pytest_haico.slurm.records import parse_slurm_time
from tests.slurm.cluster import SlurmCluster


class ShiftedClock:
    """The real wall clock, moved forward by hand so a refresh falls due at once."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset


class RecordingRun:
    """The real command runner, noting which commands ran; ``broken`` ones are "not found"."""

    def __init__(self, *broken: str) -> None:
        self.broken = set(broken)
        self.commands: list[str] = []

    def __call__(
        self, argv: Sequence[str], *, environ: Mapping[str, str] | None, timeout_s: float
    ) -> client.Answer:
        self.commands.append(argv[0])
        if argv[0] in self.broken:
            raise client.NotRun.missing(argv[0])
        return client.run(argv, environ=environ, timeout_s=timeout_s)


def inline(refresh: Callable[[], None]) -> None:
    refresh()


def _start_time(cluster: SlurmCluster, job: str, timeout: float = 30) -> float:
    """The job's start time, once it runs."""
    deadline = time.monotonic() + timeout
    while True:
        state, _, start = cluster.run("squeue", "-h", "-j", job, "-o", "%T %S").stdout.partition(
            " "
        )
        if state == "RUNNING":
            started = parse_slurm_time(start)
            assert started is not None
            return started
        if time.monotonic() > deadline:
            pytest.fail(f"job {job} is {state!r}, not RUNNING, after {timeout} s")
        time.sleep(0.2)


def test_the_end_time_of_a_running_job_is_read_and_follows_scontrol_update(
    slurm_cluster: SlurmCluster,
) -> None:
    submitted = time.time()
    job = slurm_cluster.run(
        "sbatch", "--parsable", "--time=10", "--output=/dev/null", "--wrap", "sleep 600", check=True
    ).stdout.strip()
    try:
        started = _start_time(slurm_cluster, job)
        assert int(submitted) - 1 <= started <= time.time() + 1
        env = {**os.environ, **slurm_cluster.env}
        clock, run = ShiftedClock(), RecordingRun()
        admit = WalltimeAdmission(
            job, None, drain_margin_s=120, env=env, run=run, clock=clock, spawn=inline
        )
        assert admit.end_time is not None
        assert admit.end_time.end == started + 600  # --time=10 from the start
        assert run.commands == ["squeue"]
        assert admit.warnings == ()
        admit.observe("long", "completed", 500.0)
        assert admit.refusal("short") is None  # no history: admitted
        refusal = admit.refusal("long")
        assert refusal is not None
        assert refusal.startswith(f"job {job} ends in ")
        assert refusal.endswith(
            "items of stratum long take 8 min 20 s (p95 of 1) + 120 s drain margin: not admitting"
        )

        # An admin gives the job more time; it is seen at the next refresh, not before.
        slurm_cluster.run("scontrol", "update", f"JobId={job}", "TimeLimit=20", check=True)
        assert admit.refusal("long") is not None
        assert run.commands == ["squeue"]
        clock.offset = 300
        assert admit.refusal("long") is None  # 900 s left at the shifted clock
        assert admit.end_time.end == started + 1200
        assert run.commands == ["squeue"] * 2

        # ... then takes some back with an explicit EndTime.
        end = datetime.fromtimestamp(started + 700).isoformat(timespec="seconds")
        slurm_cluster.run("scontrol", "update", f"JobId={job}", f"EndTime={end}", check=True)
        clock.offset = 600
        assert admit.refusal("long") is not None
        assert admit.end_time.end == started + 700

        # Without squeue, scontrol's record gives the same end time.
        fallback = RecordingRun("squeue")
        assert JobEndTime(job, env=env, run=fallback).refresh() == started + 700
        assert fallback.commands == ["squeue", "scontrol"]
    finally:
        slurm_cluster.run("scancel", job)


def test_a_job_slurm_does_not_know_admits_and_is_reported(slurm_cluster: SlurmCluster) -> None:
    env = {**os.environ, **slurm_cluster.env}
    admit = WalltimeAdmission("999999", None, drain_margin_s=120, env=env)
    admit.observe("long", "completed", 1e6)
    assert admit.refusal("long") is None
    (warning,) = admit.warnings
    assert warning.startswith(
        "cannot read the end time of Slurm job 999999 (squeue -h -j 999999 -o '%A %e': exit 1: "
        "slurm_load_jobs error: Invalid job id specified; scontrol -o show job 999999: exit 1: "
        "slurm_load_jobs error: Invalid job id specified);"
    )
