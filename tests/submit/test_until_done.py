"""`haico continue --until-done`: rounds until the submission is finished or a share needs a
person, backing off while nothing changes, each with the reason it waits (in-process, its
sleep the test's, against the stand-in Slurm); the shipped batch script that runs it as a
job."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from pytest_haico.submit.jobs import Request
from pytest_haico.submit.until_done import FINISHED, STOPPED, until_done
from tests.submit.campaign import REPO, Campaign, matches

# The submissions these loops continue are made by real `haico submit` processes.
pytestmark = pytest.mark.subprocess


@pytest.fixture
def smoke(campaign: Campaign, monkeypatch: pytest.MonkeyPatch) -> Campaign:
    done = campaign.haico("submit", "demo", "--stage", "smoke", "--stratum", "long")
    assert done.returncode == 0, done.stderr
    monkeypatch.setenv("PATH", campaign.slurm.path)
    return campaign


def test_it_backs_off_while_nothing_changes_and_ends_0_once_every_share_is_done(
    smoke: Campaign,
) -> None:
    lines: list[str] = []
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        if len(slept) == 3:
            smoke.finish(".smoke.demo.long", 0)
            smoke.finish(".smoke.demo.long", 1)

    status = until_done(smoke.submission(), Request(), every_min=1, say=lines.append, sleep=sleep)
    assert status == FINISHED
    assert slept == [60, 120, 240]
    matches(
        "\n".join(lines),
        [
            "haico: round 1 at *",
            "*smoke demo.long task 0 (job *_0): PENDING 0:0, 1 of 1 items owed *: pending, "
            "not resubmitted",
            "haico: next round in 1 min (2 share(s) not done, pending or running)",
            "haico: round 2 at *",
            "haico: next round in 2 min (nothing changed since the last round: backing off to "
            "every 2 min)",
            "haico: next round in 4 min (nothing changed since the last round: backing off to "
            "every 4 min)",
            "haico: round 4 at *",
            "haico: until-done: submission * finished in 4 round(s)",
        ],
    )


def test_it_reruns_what_the_infrastructure_cut_short_and_stops_1_at_a_terminal_share(
    smoke: Campaign,
) -> None:
    job = str(smoke.job(".smoke.demo.long").job_id)
    smoke.slurm.end(job, 0, "TIMEOUT")
    smoke.slurm.end(job, 1, "FAILED", "4:0")
    lines: list[str] = []

    def sleep(seconds: float) -> None:
        pytest.fail("it waited for a share that needs a person")

    status = until_done(smoke.submission(), Request(), every_min=1, say=lines.append, sleep=sleep)
    assert status == STOPPED
    matches(
        "\n".join(lines),
        [
            "*task 0 (job *_0): TIMEOUT 0:0, *: rerun (round 2): out of walltime",
            "*.continue-1.demo.long: job *, shards 0 of 2, *",
            "haico: until-done: stopped at smoke demo.long task 1 (job *_1): a usage error "
            "(exit 4): read its log *",
        ],
    )


def test_the_shipped_batch_script_hands_its_arguments_to_the_loop_and_ends_as_it_does(
    campaign: Campaign,
) -> None:
    campaign.smoke_long()
    campaign.finish(".smoke.demo.long", 1)
    bash = shutil.which("bash")
    assert bash is not None

    def batch(*args: str) -> subprocess.CompletedProcess[str]:
        """sbatch/continue.sbatch as Slurm runs it: from the project directory."""
        return subprocess.run(
            [bash, str(REPO / "sbatch" / "continue.sbatch"), *args],
            cwd=campaign.project,
            env={**os.environ, "PATH": campaign.slurm.path, "HAICO_PYTHON": sys.executable},
            capture_output=True,
            text=True,
            timeout=120,  # a hang detector, not a bound on the time it takes
        )

    finished = batch("demo", "--every", "1")
    assert finished.returncode == 0, finished.stdout + finished.stderr
    matches(
        finished.stdout,
        ["haico: round 1 at *", "haico: until-done: submission * finished in 1 round(s)"],
    )
    usage = batch("demo", "--every", "0")
    assert usage.returncode == 2 and "--every" in usage.stderr, usage.stderr
