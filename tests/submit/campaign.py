"""The demo project with enough items per shard, run against the stand-in Slurm of
`fake_slurm`, and ledger records written as its jobs' runs would write them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatch
from pathlib import Path

import pytest

from pytest_haico.config.experiment import load_experiments
from pytest_haico.config.items import ItemSpec
from pytest_haico.submit.inputs import Submission, newest_submission
from pytest_haico.submit.journal import Journal, JournaledJob
from pytest_haico.submit.shares import item_specs, items_of_task
from tests.submit.fake_slurm import FakeSlurm

REPO = Path(__file__).resolve().parents[2]


def make_project(root: Path) -> Path:
    """The demo experiments, with 12 items of stratum default and 8 of stratum long."""
    shutil.copytree(REPO / "experiments", root / "experiments")
    scripts = root / "experiments" / "scripts"
    for script in scripts.iterdir():
        script.unlink()
    # Enough items per shard that a smoke stage of two per task leaves work to the full one.
    for stratum, count in (("default", 12), ("long", 8)):
        (scripts / f"{stratum}.yaml").write_text(
            "".join(
                f"- id: {stratum}-{n}\n  stratum: {stratum}\n"
                f"  turns:\n    - user: '{stratum} question {n}?'\n"
                for n in range(count)
            )
        )
    return root


@dataclass
class Campaign:
    """The demo project, its results and the stand-in Slurm."""

    project: Path
    slurm: FakeSlurm
    done: set[str] = field(default_factory=set)  # item_ids recorded completed
    clock: int = 0

    @property
    def campaign_dir(self) -> Path:
        return self.project / "results" / "demo"

    def haico(self, *args: str, umask: int = 0o022) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "pytest_haico", *args],
            cwd=self.project,
            env={**os.environ, "PATH": self.slurm.path},
            capture_output=True,
            text=True,
            timeout=120,  # a hang detector, not a bound on the time it takes
            umask=umask,
        )

    def submission(self) -> Submission:
        return newest_submission(self.campaign_dir)

    def job(self, fragment: str) -> JournaledJob:
        """The journaled job whose name has `fragment` (".full.demo.default")."""
        jobs = Journal(self.submission().journal).read(warn=pytest.fail)
        [job] = [job for name, job in jobs.items() if fragment in name]
        return job

    def items(self, fragment: str, task: int) -> list[ItemSpec]:
        """The items of the share: task `task` of the job named with `fragment`."""
        submission = self.submission()
        plan = self.job(fragment).plan
        specs = item_specs(submission, load_experiments(submission.experiments))
        ours = [s for s in specs if (s.arm.name, s.stratum) == (plan.arm, plan.stratum)]
        return items_of_task(plan, task, ours)

    def record(
        self, fragment: str, task: int, verdicts: Sequence[str], *, node: str | None = None
    ) -> None:
        """Ledger records for the share's first items not yet done, as its run writes them;
        `node`: the run-config's NODE of that run."""
        job = self.job(fragment)
        if node is not None:
            self.run_config(fragment, task, node=node)
        ledger = self.campaign_dir / "demo" / "ledger" / f"{job.job_id}_{task}.1.jsonl"
        ledger.parent.mkdir(parents=True, exist_ok=True)
        items = [s for s in self.items(fragment, task) if s.item_id not in self.done]
        with ledger.open("a") as handle:
            for spec, verdict in zip(items, verdicts, strict=False):
                self.clock += 1
                handle.write(
                    json.dumps(
                        {
                            "schema": 2,
                            "stratum": spec.stratum,
                            "item_id": spec.item_id,
                            "attempt": 1,
                            "verdict": verdict,
                            "started_at": f"2026-01-01T00:00:{self.clock:02d}Z",
                            "finished_at": f"2026-01-01T00:00:{self.clock:02d}Z",
                            "duration_s": 1.0,
                        }
                    )
                    + "\n"
                )
                if verdict == "completed":
                    self.done.add(spec.item_id)

    def gates(
        self, fragment: str, task: int, passed: Sequence[str], *, failed: str | None = None
    ) -> None:
        """The gates.json of the share's run, every gate of `passed` passed (as a run that
        got that far writes it), then `failed` failed."""
        run = self.run_dir(fragment, task)
        gates = [{"name": name, "passed": True, "detail": "", "fix": ""} for name in passed]
        if failed is not None:
            gates.append({"name": failed, "passed": False, "detail": "it failed", "fix": ""})
        document = {"passed": failed is None, "gates": gates}
        (run / "gates.json").write_text(json.dumps(document))

    def run_dir(self, fragment: str, task: int) -> Path:
        """The share's run directory (its first run), made if need be."""
        job = self.job(fragment)
        run = self.campaign_dir / "demo" / "runs" / f"{job.job_id}_{task}.1"
        run.mkdir(parents=True, exist_ok=True)
        return run

    def run_config(self, fragment: str, task: int, *, node: str) -> None:
        """The run-config.json of the share's run, naming the node it ran on."""
        document = {"values": {"NODE": node}}
        (self.run_dir(fragment, task) / "run-config.json").write_text(json.dumps(document))

    def smoke_long(self, *options: str) -> str:
        """The smoke stage of stratum long submitted, its task 0 finished; its job id."""
        done = self.haico("submit", "demo", "--stage", "smoke", "--stratum", "long", *options)
        assert done.returncode == 0, done.stderr
        self.finish(".smoke.demo.long", 0)
        return str(self.job(".smoke.demo.long").job_id)

    def finish(self, fragment: str, task: int, *, node: str | None = None) -> None:
        """Every item of the share completed, and its task COMPLETED (on `node`)."""
        self.record(fragment, task, ["completed"] * len(self.items(fragment, task)), node=node)
        self.slurm.end(str(self.job(fragment).job_id), task, "COMPLETED", node=node)

    def started(self, fragment: str, task: int) -> None:
        """The job log Slurm writes once the task starts."""
        job = self.job(fragment)
        plan = job.plan
        log = (
            self.submission().logs
            / f"{plan.stage}.{plan.arm}.{plan.stratum}-{job.job_id}_{task}.out"
        )
        log.write_text("started\n")


def matches(stdout: str, patterns: Sequence[str]) -> None:
    """Each pattern matches a line of `stdout`, in order (fnmatch)."""
    lines = iter(stdout.splitlines())
    for pattern in patterns:
        for line in lines:
            if fnmatch(line, pattern):
                break
        else:
            pytest.fail(f"no line matches {pattern!r} (in order) in:\n{stdout}")
