"""`haico serve`'s refusals, each one line and exit 2 before anything is submitted, and the
model job's sbatch command line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pytest_haico.cli.main import main
from pytest_haico.config.settings import Profile
from pytest_haico.files import shown_path
from pytest_haico.serve.submission import SCRIPT, ModelJob, sbatch_argv


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "project"
    subprocess.run(
        [sys.executable, "-m", "pytest_haico", "init", str(root)], check=True, capture_output=True
    )
    monkeypatch.chdir(root)
    monkeypatch.setenv("CLUSTER_WORK", str(tmp_path / "work"))
    monkeypatch.setenv("PATH", str(tmp_path / "no-slurm-here"))  # nothing may be submitted
    return root


def _haico(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, list[str]]:
    status = main(["serve", *args])
    captured = capsys.readouterr()
    return status, (captured.out + captured.err).splitlines()


@pytest.mark.subprocess
def test_an_unknown_arm_is_one_line(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, lines = _haico(capsys, "nosuch", "--profile", "local")
    assert (status, lines) == (
        2,
        [f"haico: {project}/experiments/arms/nosuch.toml: no arm 'nosuch': no such arm file"],
    )


@pytest.mark.subprocess
def test_a_bad_name_or_time_is_one_line(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, lines = _haico(capsys, "standin", "--name", "Judge!")
    assert status == 2 and lines == [
        "haico: --name: 'Judge!' is not a served model's name: use [a-z0-9_.] with inner '-'"
    ]
    status, lines = _haico(capsys, "standin", "--time", "soon")
    assert status == 2 and lines[0].startswith("haico: --time: 'soon' is not a Slurm time limit")


@pytest.mark.subprocess
def test_a_catalogue_that_is_not_ours_alone_is_refused_before_submitting(
    project: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    catalogue = tmp_path / "work" / "catalogue"
    catalogue.mkdir(parents=True)
    catalogue.chmod(0o777)
    status, lines = _haico(capsys, "standin", "--profile", "local")
    assert (status, len(lines)) == (2, 1)
    assert lines[0].startswith(f"haico: the catalogue {catalogue} is writable by group and others")
    status, lines = _haico(capsys, "status", "standin")
    assert status == 2 and lines[0].startswith(f"haico: the catalogue {catalogue} is writable")


@pytest.mark.subprocess
def test_an_unknown_name_and_a_missing_catalogue_are_one_line(
    project: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    catalogue = tmp_path / "work" / "catalogue"
    catalogue.parent.mkdir()
    status, lines = _haico(capsys, "stop", "judge")
    assert (status, lines) == (
        2,
        [
            f"haico: {catalogue}: no catalogue here: no model is served (`haico serve <arm>` "
            "serves one)"
        ],
    )
    catalogue.mkdir(mode=0o750, parents=True)
    status, lines = _haico(capsys, "status", "judge")
    assert status == 2 and lines == [
        f"haico: no served model named 'judge' in {catalogue} (served there: none); start it "
        "with `haico serve <arm> --name judge`"
    ]
    assert _haico(capsys, "--list") == (
        0,
        [f"haico: no model is served in {shown_path(catalogue)}"],
    )


@pytest.mark.subprocess
def test_words_that_are_no_command_are_one_line(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for words in ([], ["status"], ["a", "b"], ["--list", "x"]):
        status, lines = _haico(capsys, *words)
        assert status == 2 and len(lines) == 1, (words, lines)


def test_the_model_job_is_submitted_with_its_time_signal_requeue_and_no_secret(
    tmp_path: Path,
) -> None:
    catalogue = tmp_path / "catalogue"
    arm_file = tmp_path / "experiments" / "arms" / "qwen32b.toml"
    job = ModelJob(
        arm_file=arm_file,
        name="judge",
        profile=Profile.CLUSTER,
        catalogue=catalogue,
        file_mode=0o640,
        python="/venv/bin/python",
        time="8:00:00",
    )
    logs = catalogue / "logs"
    assert sbatch_argv(job) == [
        "sbatch",
        "--parsable",
        "--nodes=1",
        "--job-name=haico.serve.judge",
        f"--output={logs}/judge.%j.out",
        f"--chdir={logs}",
        "--signal=B:USR1@60",
        "--requeue",
        "--export=ALL,HAICO_PYTHON=/venv/bin/python",
        "--time=8:00:00",
        str(SCRIPT),
        "--arm-file",
        str(arm_file),
        "--name",
        "judge",
        "--profile",
        "cluster",
        "--catalogue",
        str(catalogue),
        "--log-dir",
        str(logs),
        "--file-mode",
        "640",
        "--time",
        "8:00:00",
    ]
