"""`haico submit` and `haico continue` as a user runs them, against recording stand-ins
for Slurm's client commands (the real daemons are in tests/slurm): the allow-listed
environment, --dry-run, a refused submission, and one-line errors for bad input."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

# Each test runs a child process (the fast loop, `-m "not slow"`, leaves them out).
pytestmark = pytest.mark.subprocess

REPO = Path(__file__).resolve().parents[2]
SECRET = "sk-haico-offline-secret"
ALLOWED = {"HOME", "USER", "LOGNAME", "SHELL", "PATH", "LANG", "TZ", "TMPDIR", "SLURM_CONF"}


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    shutil.copytree(REPO / "experiments", root / "experiments")
    (root / "sbatch").mkdir()
    shutil.copy(REPO / "sbatch" / "campaign.sbatch", root / "sbatch")
    return root


@pytest.fixture
def slurm_bin(tmp_path: Path) -> Path:
    """sbatch records its environment and argv and answers a job id; the queries know of
    no job; sinfo has one partition."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    calls.mkdir()
    scripts = {
        "sbatch": (
            f"shopt -s nullglob; seen=({calls}/*.env); n=${{#seen[@]}}\n"
            f"/usr/bin/env > {calls}/$n.env\n"
            f'printf "%s\\n" "$@" > {calls}/$n.argv\n'
            f"if [[ -e {tmp_path}/refuse ]]; then\n"
            '  echo "sbatch: error: Batch job submission failed: Invalid partition" >&2\n'
            "  exit 1\nfi\necho $((4242 + n))\n"
        ),
        "sinfo": 'echo "debug* 1:00:00"\n',
        "squeue": "exit 0\n",
        "sacct": 'echo "sacct: error: Slurm accounting storage is disabled" >&2\nexit 1\n',
        "scontrol": "echo 'slurm_load_jobs error: Invalid job id specified' >&2; exit 1\n",
    }
    for name, body in scripts.items():
        path = bin_dir / name
        path.write_text("#!/bin/bash\n" + body)
        path.chmod(0o755)
    return bin_dir


def _haico(project: Path, *args: str, path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest_haico", *args],
        cwd=project,
        env={
            **os.environ,
            "PATH": str(path),
            "OPENAI_API_KEY": SECRET,
            "CUDA_VISIBLE_DEVICES": "0,1",
            "SLURM_CPU_BIND": "none",
            **env,
        },
        capture_output=True,
        text=True,
        timeout=60,
    )


def _journal(project: Path) -> list[dict[str, object]]:
    [path] = (project / "results" / "demo" / "submissions").glob("*/journal.jsonl")
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_sbatch_sees_only_the_allow_listed_environment_and_the_job_gets_haicos_settings(
    project: Path, slurm_bin: Path, tmp_path: Path
) -> None:
    done = _haico(project, "submit", "demo", "--stage", "smoke", path=slurm_bin)
    assert done.returncode == 0, done.stderr
    calls = tmp_path / "calls"
    envs = sorted(calls.glob("*.env"))
    assert len(envs) == 2  # one array per stratum: default and long
    for env_file in envs:
        names = {line.partition("=")[0] for line in env_file.read_text().splitlines()}
        # bash itself adds PWD, SHLVL and _ to what it was given.
        assert names - {"PWD", "SHLVL", "_"} <= ALLOWED | {n for n in names if n.startswith("LC_")}
        assert SECRET not in env_file.read_text()
    argv = (calls / "0.argv").read_text().splitlines()
    [export] = [a for a in argv if a.startswith("--export=")]
    assert export.startswith(f"--export=ALL,HAICO_PYTHON={sys.executable},")
    assert "HAICO_INPUTS_DIGEST=sha256:" in export and "HAICO_SHARD_COUNT=2" in export
    assert "--array=0-1" in argv and "--haico-limit-per-stratum=2" in argv
    assert "--nodes=1" in argv  # over whatever the batch script asks
    states = [(e["job"], e["state"]) for e in _journal(project)]
    assert [s for _, s in states] == ["PREPARED", "SUBMITTING", "SUBMITTED"] * 2
    assert "job 4242" in done.stdout and "job 4243" in done.stdout
    [checklist] = (project / "results" / "demo" / "submissions").glob("*/checklist.md")
    assert "--stage full" in checklist.read_text()


def test_a_dry_run_prints_each_sbatch_command_line_and_writes_nothing(
    project: Path, slurm_bin: Path, tmp_path: Path
) -> None:
    smoke = _haico(project, "submit", "demo", "--stage", "smoke", "--dry-run", path=slurm_bin)
    full = _haico(project, "submit", "demo", "--stage", "full", "--dry-run", path=slurm_bin)
    assert smoke.returncode == 0 and full.returncode == 0, smoke.stderr + full.stderr
    commands = _commands(smoke.stdout)
    assert len(commands) == 2
    assert all("--array=0-1" in c and "--time=00:30:00" in c for c in commands)
    [full_default, _] = _commands(full.stdout)
    assert "'--dependency=afterok:<the smoke jobs of arm demo>'" in full_default
    assert "--kill-on-invalid-dep=yes" in full_default
    # What is printed is what a shell runs: the words of the command haico would run.
    words = shlex.split(full_default.replace("\\\n", " "))
    assert words[:2] == ["sbatch", "--parsable"] and words[-1].endswith("/experiments")
    assert not (project / "results").exists()
    assert list((tmp_path / "calls").iterdir()) == []


@pytest.mark.parametrize("dry_run", [False, True], ids=["submit", "dry-run"])
def test_the_first_submit_of_experiments_with_a_cluster_env_plans_before_it_freezes(
    project: Path, slurm_bin: Path, tmp_path: Path, dry_run: bool
) -> None:
    """The items' ids are planned from the sources' cluster.env: the frozen copy does not
    exist yet (it once failed, exit 2, reading the copy's cluster.env)."""
    work = tmp_path / "work"
    (project / "experiments" / "cluster.env").write_text(f"CLUSTER_WORK={work}\n")
    args = ("submit", "demo", "--stage", "smoke", *(["--dry-run"] if dry_run else []))
    done = _haico(project, *args, path=slurm_bin)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    frozen = list((work / "results" / "demo" / "submissions").glob("*/experiments/cluster.env"))
    assert len(frozen) == (0 if dry_run else 1)


def test_a_smoke_stage_queues_no_more_tasks_than_its_limit_has_items(
    project: Path, slurm_bin: Path
) -> None:
    smoke = _haico(
        project, "submit", "demo", "--stage", "smoke", "--limit", "1", "--dry-run", path=slurm_bin
    )
    assert smoke.returncode == 0, smoke.stderr
    commands = _commands(smoke.stdout)
    assert len(commands) == 2
    # One item of each stratum in all: one task each, not a second task with nothing to do.
    assert all("--array=0 " in c.replace("\\\n", " ") for c in commands), commands


def _commands(stdout: str) -> list[str]:
    """The sbatch commands a dry run printed, each with its continuation lines."""
    commands: list[str] = []
    lines = iter(stdout.splitlines())
    for line in lines:
        if line.startswith("sbatch "):
            block = [line]
            while block[-1].endswith("\\"):
                block.append(next(lines))
            commands.append("\n".join(block))
    return commands


def test_a_refused_submission_goes_back_to_prepared_and_a_rerun_submits_it(
    project: Path, slurm_bin: Path, tmp_path: Path
) -> None:
    (tmp_path / "refuse").touch()  # (a variable would not pass the allow-list)
    refused = _haico(project, "submit", "demo", "--stage", "smoke", path=slurm_bin)
    assert refused.returncode == 2
    assert refused.stderr.splitlines() == [
        "haico: sbatch failed (exit 1): sbatch: error: Batch job submission failed: "
        "Invalid partition"
    ]
    assert _journal(project)[-1]["state"] == "PREPARED"
    (tmp_path / "refuse").unlink()
    again = _haico(project, "submit", "demo", "--stage", "smoke", path=slurm_bin)
    assert again.returncode == 0, again.stderr
    assert [e["state"] for e in _journal(project)][-1] == "SUBMITTED"


def test_the_full_stage_without_a_smoke_stage_is_refused(project: Path, slurm_bin: Path) -> None:
    done = _haico(project, "submit", "demo", "--stage", "full", path=slurm_bin)
    assert done.returncode == 2
    [line] = done.stderr.splitlines()
    assert "no smoke stage was submitted for these inputs" in line


def _one_line_error(done: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("haico: ")
    for needle in needles:
        assert needle in lines[0]


def test_sbatch_missing_from_path(project: Path, slurm_bin: Path) -> None:
    (slurm_bin / "sbatch").unlink()
    done = _haico(project, "submit", "demo", "--stage", "smoke", path=slurm_bin)
    _one_line_error(done, "sbatch is not on PATH")
    assert _journal(project)[-1]["state"] == "PREPARED"  # certainly not submitted


def test_an_unknown_campaign(project: Path, slurm_bin: Path) -> None:
    _one_line_error(
        _haico(project, "continue", "nosuch", path=slurm_bin), "results/nosuch", "no campaign"
    )
    _one_line_error(_haico(project, "cost", "results/nosuch", path=slurm_bin), "nosuch")


def test_a_campaign_without_ledgers_or_submissions(project: Path, slurm_bin: Path) -> None:
    (project / "results" / "empty").mkdir(parents=True)
    _one_line_error(_haico(project, "cost", "results/empty", path=slurm_bin), "no ledgers yet")
    _one_line_error(_haico(project, "continue", "empty", path=slurm_bin), "has no submission yet")


def test_a_corrupt_journal_line(project: Path, slurm_bin: Path) -> None:
    assert _haico(project, "submit", "demo", "--stage", "smoke", path=slurm_bin).returncode == 0
    [path] = (project / "results" / "demo" / "submissions").glob("*/journal.jsonl")
    lines = path.read_text().splitlines()
    lines[1] = lines[1][:20] + "#" + lines[1][21:]
    path.chmod(0o644)
    path.write_text("\n".join(lines) + "\n")
    _one_line_error(
        _haico(project, "continue", "demo", path=slurm_bin), "line 2 is not a journal entry"
    )


def test_no_experiments_directory(tmp_path: Path, slurm_bin: Path) -> None:
    _one_line_error(
        _haico(tmp_path, "submit", "demo", "--stage", "smoke", path=slurm_bin),
        "no experiments directory",
    )


@pytest.mark.parametrize(
    ("parallel", "slurm", "refusal"),
    [
        (
            "tensor_parallel_size = 4",
            "",
            "arm demo needs tensor_parallel_size 4 x data_parallel_size 1 = 4 GPUs on one node "
            "(a model copy cannot span nodes), but no node of partition debug has more than 2 "
            "(sinfo's GRES): lower the parallel sizes in arms/demo.toml, or choose a partition "
            "with 4-GPU nodes ([slurm] partition)",
        ),
        (
            "tensor_parallel_size = 2",
            'gres = "gpu:1"',
            "arm demo needs tensor_parallel_size 2 x data_parallel_size 1 = 2 GPUs, but its "
            "[slurm] gres = 'gpu:1' asks for 1: set gres = \"gpu:2\" in arms/demo.toml, or "
            "change the parallel sizes",
        ),
        ("tensor_parallel_size = 1\ndata_parallel_size = 2", 'gres = "gpu:a100:2"', None),
    ],
)
def test_an_arm_whose_model_cannot_get_its_gpus_on_one_node_is_refused_before_any_job(
    project: Path,
    slurm_bin: Path,
    tmp_path: Path,
    parallel: str,
    slurm: str,
    refusal: str | None,
) -> None:
    arm = project / "experiments" / "arms" / "demo.toml"
    text = arm.read_text().replace("[vllm]\n", f"[vllm]\n{parallel}\n")
    arm.write_text(text.replace("[slurm]\n", f"[slurm]\n{slurm}\n"))
    (slurm_bin / "sinfo").write_text('#!/bin/bash\necho "debug* 1:00:00 gpu:a100:2(S:0-1)"\n')

    for dry_run in (("--dry-run",), ()):
        args = ("submit", "demo", "--stage", "smoke", "--profile", "cluster", *dry_run)
        done = _haico(project, *args, path=slurm_bin)
        if refusal is None:
            assert done.returncode == 0, done.stderr
            continue
        assert (done.returncode, done.stderr) == (2, f"haico: {refusal}\n")
    # Refused: nothing queued. Else the smoke stage's two arrays (strata default and long).
    assert len(list((tmp_path / "calls").glob("*.argv"))) == (0 if refusal else 2)
