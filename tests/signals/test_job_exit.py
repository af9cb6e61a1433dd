"""A batch job ends 0, 75, 78 or 4, whatever ends its pytest: the batch script itself, run
by bash as Slurm runs it, over real pytest runs killed by real signals. A signal that kills
pytest (a `kill -9`, a TERM once pytest's handlers are gone at its exit) gives 75 when its
ledgers still owe an item and 0 when they do not; never 137 or 143. Services die with a
pytest killed by SIGKILL."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from pytest_haico.procfs import iter_processes
from tests.harness import CampaignProject
from tests.polling import wait_for
from tests.signals.conftest import (
    ARTIFACT_TURN,
    HANGING_ARM,
    hanging_requests,
    run_dir,
    services_alive,
    stack_campaign,
)

WRAPPER = Path(__file__).resolve().parents[2] / "sbatch" / "campaign.sbatch"
# The session's very end: pytest's handlers are restored (TERM is SIG_DFL again), the
# campaign's records written; `exiting` says so and the exit waits, as a slow one would.
EXITING_CONFTEST = """
import time
from pathlib import Path

import pytest


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    Path("exiting").touch()
    time.sleep(120)
"""


@dataclass
class Job:
    """The batch script running in the background, its log, and the pytest it started."""

    process: subprocess.Popen[bytes]
    log: Path

    def pytest_pid(self) -> int:
        [pid] = [p.pid for p in iter_processes() if p.ppid == self.process.pid]
        return pid

    def wait(self) -> int:
        return self.process.wait(timeout=120)

    def output(self) -> str:
        return self.log.read_text(errors="replace")


StartJob = Callable[..., Job]


@pytest.fixture
def start_job(campaign: CampaignProject) -> Iterator[StartJob]:
    """Start the batch script over the campaign's experiments (pytest `args` after them, `env`
    added); jobs still running at teardown are killed."""
    jobs: list[Job] = []

    def start(*args: str, env: dict[str, str] | None = None) -> Job:
        log = campaign.root / f"job-{len(jobs)}.out"
        with pytest.MonkeyPatch.context() as patch, log.open("w") as out:
            patch.setenv("HAICO_PYTHON", sys.executable)
            for name, value in (env or {}).items():
                patch.setenv(name, value)
            process = campaign.pytester.popen(
                ["bash", str(WRAPPER), "experiments", *args],
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        jobs.append(Job(process, log))
        return jobs[-1]

    yield start
    for job in jobs:
        if job.process.poll() is None:
            job.process.kill()
            job.process.wait(timeout=60)


def test_a_kill_9_of_pytest_with_items_owed_ends_the_job_75(
    campaign: CampaignProject, start_job: StartJob
) -> None:
    campaign.arm("demo")
    campaign.simple_scripts("s1", "s2", "s3")
    job = start_job(env={"HAICO_TEST_ITEM_SECONDS": "2"})
    wait_for(lambda: len(campaign.ledger_lines("demo")) >= 1, timeout=60, what="one record")
    job.pytest_pid()  # still running: two items have no record yet
    subprocess.run(["kill", "-9", str(job.pytest_pid())], check=True)
    assert job.wait() == 75, job.output()
    assert (
        "haico: pytest was killed by SIGKILL (exit 137); 2 of its 3 item(s) have no final "
        "record in its ledgers: exit 75, resubmit to continue"
    ) in job.output()


@pytest.mark.parametrize(
    ("second", "code", "line"),
    [
        ("hello", 0, " after all of its 2 item(s) were recorded: exit 0"),
        ("infra", 75, "; 1 of its 2 item(s) have no final record in its ledgers: exit 75, "
         "resubmit to continue"),
    ],
)  # fmt: skip
def test_a_term_during_pytests_own_exit_ends_the_job_by_what_is_owed(
    campaign: CampaignProject,
    start_job: StartJob,
    second: str,
    code: int,
    line: str,
) -> None:
    campaign.arm("demo")
    campaign.simple_scripts("s1")
    campaign.simple_scripts("s2", text=second)  # "infra": a retry is owed
    campaign.pytester.makeconftest(EXITING_CONFTEST)
    job = start_job()
    wait_for((campaign.root / "exiting").exists, timeout=60, what="pytest at its exit")
    subprocess.run(["kill", "-TERM", str(job.pytest_pid())], check=True)
    assert job.wait() == code, job.output()
    assert f"haico: pytest was killed by SIGTERM (exit 143){line}" in job.output()


def test_every_service_dies_within_5_s_of_a_kill_9_of_pytest_and_the_job_ends_75(
    campaign: CampaignProject, start_job: StartJob
) -> None:
    stack_campaign(campaign, HANGING_ARM, items=4, text=ARTIFACT_TURN)
    job = start_job("--haico-dump-interval=0")
    wait_for(lambda: hanging_requests(campaign) >= 2, timeout=120, what="2 in flight")
    run = run_dir(campaign)
    assert {s["name"] for s in services_alive(run)} == {"postgres", "llm", "backend"}
    subprocess.run(["kill", "-9", str(job.pytest_pid())], check=True)
    wait_for(lambda: services_alive(run) == [], timeout=5, what="every service gone")
    assert job.wait() == 75, job.output()
    assert "haico: pytest was killed by SIGKILL (exit 137); 4 of its 4 item(s)" in job.output()
