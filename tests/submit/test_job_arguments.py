"""What a submitted job runs: the frozen copy with its own pytest configuration and rootdir,
whatever the project's live pytest.ini says by the time the job starts. The jobs here are
the command lines `haico submit` gave a recording sbatch, run by the batch script itself
(no Slurm: the tests in tests/slurm cover the daemons)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.harness import CONVERSATION_MODULE, ITEM_MODULE

# Each test runs a child process (the fast loop, `-m "not slow"`, leaves them out).
pytestmark = pytest.mark.subprocess

ARM = '[slurm]\ntime = "00:10:00"\n'
SERVED_ARM = ARM + '[model]\nserved = "shared"\n'  # attaches to a model `haico serve` serves
SCRIPTS = "".join(
    json.dumps({"id": f"s{i}", "turns": [{"user": f"hello {i}"}]}) + "\n" for i in range(4)
)
LIVE_INI = (
    "[pytest]\naddopts = -p no:langsmith_plugin\nasyncio_default_fixture_loop_scope = function\n"
)
# What the project's pytest.ini says after submission: a job that reads it ends exit 4.
EDITED_INI = "[pytest]\naddopts = --an-option-no-job-may-read\n"


@dataclass(frozen=True)
class SubmittedJob:
    """One sbatch call `haico submit` made: where the job runs, what it exports, its script
    and the script's arguments."""

    chdir: Path
    exports: dict[str, str]
    command: list[str]

    @classmethod
    def parse(cls, argv: list[str]) -> SubmittedJob:
        options = [a for a in argv if a.startswith("--")]
        chdir = next(a.removeprefix("--chdir=") for a in options if a.startswith("--chdir="))
        export = next(a.removeprefix("--export=") for a in options if a.startswith("--export="))
        exports = dict(pair.split("=", 1) for pair in export.split(",")[1:])  # after ALL
        script = next(i for i, a in enumerate(argv) if a.endswith("campaign.sbatch"))
        return cls(Path(chdir), exports, argv[script:])

    def run(self, log: Path, *, task: int) -> int:
        """The job's task `task`, as Slurm would start it (its log in `log`)."""
        env = {
            **os.environ,
            **self.exports,
            "SLURM_JOB_ID": str(100 + task),
            "SLURM_ARRAY_JOB_ID": "99",
            "SLURM_ARRAY_TASK_ID": str(task),
            "SLURM_ARRAY_TASK_COUNT": "2",
        }
        with log.open("wb") as out:
            done = subprocess.run(
                ["bash", *self.command],
                cwd=self.chdir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=120,
                check=False,
            )
        return done.returncode


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    (root / "experiments" / "arms").mkdir(parents=True)
    (root / "experiments" / "scripts").mkdir()
    (root / "experiments" / "arms" / "demo.toml").write_text(ARM)
    (root / "experiments" / "scripts" / "chat.jsonl").write_text(SCRIPTS)
    (root / "experiments" / "test_conversations.py").write_text(ITEM_MODULE)
    (root / "pytest.ini").write_text(LIVE_INI)
    return root


def served_arm(project: Path) -> None:
    """Arm demo attaches to served model `shared`, and the items converse with the stack."""
    (project / "experiments" / "arms" / "demo.toml").write_text(SERVED_ARM)
    (project / "experiments" / "test_conversations.py").write_text(CONVERSATION_MODULE)


def submit_smoke(
    project: Path, tmp_path: Path, environ: dict[str, str] | None = None
) -> list[SubmittedJob]:
    """`haico submit demo --stage smoke` (in `environ` added to this one) against an sbatch
    that records each call."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "calls"
    bin_dir.mkdir()
    calls.mkdir()
    stubs = {
        "sbatch": f'n=$(ls {calls} | wc -l)\nprintf "%s\\n" "$@" > {calls}/$n\necho $((42 + n))\n',
        "sinfo": 'echo "debug* 1:00:00"\n',
        "squeue": "exit 0\n",
        "sacct": "exit 1\n",
        "scontrol": "exit 1\n",
    }
    for name, body in stubs.items():
        (bin_dir / name).write_text("#!/bin/bash\n" + body)
        (bin_dir / name).chmod(0o755)
    done = subprocess.run(
        [sys.executable, "-m", "pytest_haico", "submit", "demo", "--stage", "smoke"],
        cwd=project,
        env={**os.environ, **(environ or {}), "PATH": f"{bin_dir}:{os.environ['PATH']}"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return [SubmittedJob.parse(call.read_text().splitlines()) for call in sorted(calls.iterdir())]


def test_a_job_runs_the_frozen_pytest_ini_and_rootdir_never_the_live_one(
    project: Path, tmp_path: Path
) -> None:
    [job] = submit_smoke(project, tmp_path)
    (project / "pytest.ini").write_text(EDITED_INI)
    log = tmp_path / "task0.out"
    assert job.run(log, task=0) == 0, log.read_text()
    out = log.read_text()
    assert f"\nrootdir: {job.chdir}\nconfigfile: pytest.ini\n" in out, out
    assert "an-option-no-job-may-read" not in out
    records = [
        json.loads(line)
        for ledger in (project / "results" / "demo" / "demo" / "ledger").glob("*.jsonl")
        for line in ledger.read_text().splitlines()
    ]
    assert [r["run_id"] for r in records] == ["99_0.1"] * len(records) and records


def test_every_option_of_a_job_carries_its_value_in_its_own_word(
    project: Path, tmp_path: Path
) -> None:
    [job] = submit_smoke(project, tmp_path)
    arguments = job.command[1:]
    *options, path = arguments
    assert path == str(job.chdir / "experiments")
    assert all(o.startswith("--") and "=" in o for o in options), arguments
    assert f"--config-file={job.chdir / 'pytest.ini'}" in options
    assert f"--rootdir={job.chdir}" in options
    assert "--haico-limit-per-stratum=2" in options


def test_a_job_looks_for_its_served_model_in_the_catalogue_its_submitting_shell_resolved(
    project: Path, tmp_path: Path
) -> None:
    """Not in the frozen copy's `<rootdir>/catalogue`: in the project's, where `haico serve`
    from that shell registers (no CLUSTER_WORK says otherwise)."""
    served_arm(project)
    [job] = submit_smoke(project, tmp_path)
    catalogue = project / "catalogue"
    assert f"--haico-catalogue={catalogue}" in job.command
    log = tmp_path / "task0.out"
    assert job.run(log, task=0) == 78, log.read_text()
    assert (
        f"gate served_model failed: {catalogue}: no catalogue here: no model is served "
        "(`haico serve <arm>` serves one)" in log.read_text()
    ), log.read_text()


def test_a_catalogue_the_jobs_node_cannot_see_is_gate_78_naming_it_the_node_and_the_fix(
    project: Path, tmp_path: Path
) -> None:
    """The catalogue resolved at submit lies where the job's node has no such directory (a
    path only the login node has): the served-model gate names the path, the node and the
    fix, before anything starts."""
    served_arm(project)
    elsewhere = tmp_path / "login-node-only"
    [job] = submit_smoke(
        project, tmp_path, {"PYTEST_HAICO_CATALOGUE": str(elsewhere / "catalogue")}
    )
    log = tmp_path / "task0.out"
    assert job.run(log, task=0) == 78, log.read_text()
    assert (
        f"gate served_model failed: {elsewhere / 'catalogue'}: no catalogue here: {elsewhere} "
        f"does not exist on {socket.gethostname()}: a served model is found only through a "
        "catalogue on a file system shared with the node that serves it (set CLUSTER_WORK, or "
        "--haico-catalogue DIR, to a shared directory); serve it" in log.read_text()
    ), log.read_text()
