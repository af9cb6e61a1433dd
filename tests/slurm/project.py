"""A project of the demo experiments with the batch script, run with `haico` against a real
Slurm of the tests (one node, or a node of a multi-node cluster): its journal, jobs and
records."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from tests.slurm.cluster import SlurmCluster
from tests.slurm.nodes import MultiNodeCluster

REPO = Path(__file__).resolve().parents[2]
SECRET = "sk-haico-test-secret-4711"
TERMINAL = {"completed", "expectation_failed", "recursion_limit", "blank_turn", "substituted"}


@dataclass
class Project:
    """A copy of the demo experiments with the batch script, and a results root."""

    root: Path
    cluster: SlurmCluster
    env_dumps: Path
    host: str | None = None  # the node of a MultiNodeCluster that `haico` runs on

    @property
    def results(self) -> Path:
        return self.root / "results"

    @property
    def campaign_dir(self) -> Path:
        return self.results / "demo"

    def haico(
        self, *args: str, path: str | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """`python -m pytest_haico ...` from the project, as a user's shell runs it: with
        tokens and an salloc shell's Slurm variables that must not reach the jobs."""
        argv, env = self.command(args, path=path)
        return subprocess.run(
            argv, cwd=self.root, env=env, capture_output=True, text=True, timeout=timeout
        )

    def command(
        self, args: Sequence[str], *, host: str | None = None, path: str | None = None
    ) -> tuple[list[str], dict[str, str]]:
        """The argv and environment of `haico args` on `host` (default: the project's)."""
        env = {
            **os.environ,
            **self.cluster.env,
            "OPENAI_API_KEY": SECRET,
            "SLURM_MEM_PER_CPU": "7",
            "PYTEST_HAICO_CONCURRENCY": "1",
        }
        if path is not None:
            env["PATH"] = path
        argv: list[str] = [sys.executable, "-m", "pytest_haico", *args]
        host = host or self.host
        if host is not None:
            assert isinstance(self.cluster, MultiNodeCluster)
            argv = self.cluster.on(host, argv, cwd=self.root)
            env["TMPDIR"] = str(self.cluster.tmpdir)
        return argv, env

    def journal(self) -> list[dict[str, Any]]:
        [path] = self.campaign_dir.glob("submissions/*/journal.jsonl")
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def job_ids(self, stage: str) -> list[str]:
        return [
            e["job_id"]
            for e in self.journal()
            if e["state"] == "SUBMITTED" and f".{stage}." in e["job"]
        ]

    def records(self) -> list[dict[str, Any]]:
        return [
            json.loads(line)
            for path in sorted((self.campaign_dir / "demo" / "ledger").glob("*.jsonl"))
            for line in path.read_text().splitlines()
            if line.strip()
        ]


def make_project(tmp_path: Path, cluster: SlurmCluster, *, host: str | None = None) -> Project:
    """The demo experiments under `tmp_path`, each job's environment dumped as it starts."""
    root = tmp_path / "project"
    shutil.copytree(REPO / "experiments", root / "experiments")
    (root / "sbatch").mkdir()
    shutil.copy(REPO / "sbatch" / "campaign.sbatch", root / "sbatch" / "campaign.sbatch")
    (root / "pyproject.toml").write_text(
        '[tool.pytest.ini_options]\nasyncio_default_fixture_loop_scope = "function"\n'
        'addopts = ["-p", "no:langsmith_plugin"]\n'
    )
    dumps = tmp_path / "env"
    dumps.mkdir()
    # What each job's pytest sees of its environment.
    (root / "experiments" / "conftest.py").write_text(
        "import json, os, pathlib\n\n\n"
        "def pytest_configure(config):\n"
        f"    out = pathlib.Path({str(dumps)!r})\n"
        "    name = os.environ.get('SLURM_JOB_ID', 'none')\n"
        "    (out / f'{name}.json').write_text(json.dumps(dict(os.environ)))\n"
    )
    return Project(root=root, cluster=cluster, env_dumps=dumps, host=host)


def work_items(project: Project, *, count: int, turns: int, latency_ms: int) -> None:
    """The demo arm, one conversation at a time, over `count` items of stratum `work`."""
    experiments = project.root / "experiments"
    for script in (experiments / "scripts").iterdir():
        script.unlink()
    (experiments / "scripts" / "work.yaml").write_text(
        "".join(
            f"- id: work-{n}\n  stratum: work\n  turns:\n"
            + "".join(f"    - user: 'Question {k} of task {n}?'\n" for k in range(turns))
            for n in range(count)
        )
    )
    arm = experiments / "arms" / "demo.toml"
    text = arm.read_text().replace("latency_ms = 20", f"latency_ms = {latency_ms}")
    arm.write_text(text.replace("concurrency = 4", "concurrency = 1"))


def smoke_then_full(project: Project, *, tasks: int, time: str) -> str:
    """A smoke stage of one item per task run to COMPLETED, then the full stage submitted
    over `tasks` array tasks; the full job's id."""
    smoke = project.haico("submit", "demo", "--stage", "smoke", "--limit", "1")
    assert smoke.returncode == 0, smoke.stderr
    [smoke_id] = project.job_ids("smoke")
    assert set(project.cluster.wait_ended(smoke_id).values()) == {"COMPLETED"}
    full = project.haico("submit", "demo", "--stage", "full", "--tasks", str(tasks), "--time", time)
    assert full.returncode == 0, full.stderr
    [full_id] = project.job_ids("full")
    return str(full_id)


def terminal_once(project: Project, count: int) -> None:
    terminal = Counter(r["item_id"] for r in project.records() if r["verdict"] in TERMINAL)
    assert len(terminal) == count and set(terminal.values()) == {1}, "an item ran twice or never"


def end_time_in(seconds: float) -> str:
    """An `scontrol update EndTime=` value at least `seconds` from now (whole seconds)."""
    return datetime.fromtimestamp(math.ceil(time.time() + seconds)).isoformat(timespec="seconds")
