"""`haico init`: a new experiments repository runs at once, without a warning."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pytest_haico.config.experiment import load_experiments

# Each test runs a child process (the fast loop, `-m "not slow"`, leaves them out).
pytestmark = pytest.mark.subprocess


def _run(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *argv], cwd=cwd, capture_output=True, text=True, timeout=300
    )


def test_a_new_repository_runs_its_campaign_on_the_local_profile_without_a_warning(
    tmp_path: Path,
) -> None:
    made = _run("-m", "pytest_haico", "init", "new", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    root = tmp_path / "new"
    experiments = load_experiments(root / "experiments")
    assert len(experiments.arms) == 1 and len(experiments.scripts) == 2
    turns = [turn for source in experiments.scripts for turn in source.script.turns]
    assert any(turn.branch_from is not None for turn in turns)
    assert any(turn.expect is not None for turn in turns)
    assert (root / "sbatch" / "campaign.sbatch").stat().st_mode & 0o111
    for command in ("pytest experiments", "haico submit"):
        assert command in made.stdout

    run = _run("-m", "pytest", "-W", "error", cwd=root)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "2 passed" in run.stdout
    assert "warning" not in (run.stdout + run.stderr).lower()


def test_init_refuses_a_directory_that_holds_something(tmp_path: Path) -> None:
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("mine")
    refused = _run("-m", "pytest_haico", "init", "taken", cwd=tmp_path)
    assert refused.returncode == 2
    [line] = refused.stderr.splitlines()
    assert "is not an empty directory" in line
    assert (tmp_path / "taken" / "notes.txt").read_text() == "mine"


def test_init_refuses_an_empty_directory_others_can_write(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # as a directory another user made for you, or one left open
    refused = _run("-m", "pytest_haico", "init", "shared", cwd=tmp_path)
    assert refused.returncode == 2
    assert refused.stderr.splitlines() == [
        "haico: shared is writable by group and others (mode 0777): another user could "
        "swap what your campaigns run (the test module is Python that pytest imports): give "
        "a directory of your own"
    ]
    assert list(shared.iterdir()) == []


def test_the_new_repositorys_gitignore_covers_results_and_the_catalogue(tmp_path: Path) -> None:
    # `haico serve` without $CLUSTER_WORK registers under <rootdir>/catalogue, key files
    # beside the entries.
    made = _run("-m", "pytest_haico", "init", "new", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    root = tmp_path / "new"
    (root / "catalogue").mkdir()
    (root / "catalogue" / "judge.41.key").write_text("sk-secret\n")
    (root / "results").mkdir()
    (root / "results" / "ledger.jsonl").write_text("{}\n")
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    listed = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=all"],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "catalogue/" not in listed and "results/" not in listed, listed
    assert "experiments/arms/standin.toml" in listed, listed
