"""`haico env`'s job, run as the batch script runs it (`python -m pytest_haico.site.job
PLAN`): a real venv built from a lock (a tiny real wheel) and verified by importing vllm, a
second job that does nothing, and the pulls through the Apptainer shim with the registry
token in the pull's environment and nowhere else."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_haico.config.cluster_env import load_cluster_env
from pytest_haico.config.cluster_site import resolve_cluster_site
from pytest_haico.site.env import EnvRequest, plan_env
from pytest_haico.site.images import Pull, pull_images
from pytest_haico.site.plan import write_plan
from pytest_haico.site.venv import MARKER, PARTIAL
from tests.site.env_site import (
    BACKEND_IMAGE,
    POSTGRES_IMAGE,
    TOKEN,
    EnvSite,
    fake_vllm_wheel,
    make_env_site,
)


def _plan(site: EnvSite, request: EnvRequest) -> Path:
    """The plan `haico env` writes for `request`."""
    cluster = resolve_cluster_site(load_cluster_env(site.cluster_env), site.environ())
    plan = plan_env(cluster, site.experiments, request, say=lambda line: None)
    plan_file = site.root / "plan.json"
    plan_file.unlink(missing_ok=True)
    write_plan(plan_file, plan)
    assert TOKEN not in plan_file.read_text()
    return plan_file


def _run_job(site: EnvSite, plan_file: Path) -> subprocess.CompletedProcess[str]:
    """The job on `plan_file`, as the batch script runs it."""
    return subprocess.run(
        [sys.executable, "-m", "pytest_haico.site.job", str(plan_file)],
        env=site.environ(),
        capture_output=True,
        text=True,
        timeout=300,
    )


def _job(site: EnvSite, request: EnvRequest) -> subprocess.CompletedProcess[str]:
    return _run_job(site, _plan(site, request))


@pytest.mark.subprocess
def test_the_job_builds_the_venv_from_the_lock_verifies_it_and_a_second_job_does_nothing(
    tmp_path: Path,
) -> None:
    site = make_env_site(tmp_path)
    plan = _plan(site, EnvRequest(images=False))
    kept = plan.read_bytes()
    built = _run_job(site, plan)
    assert built.returncode == 0, built.stdout + built.stderr
    marker = json.loads((site.venv / MARKER).read_text())
    assert marker["vllm_version"] == "0.0.1"  # what `import vllm` in the new venv said
    assert marker["sha256"] == _sha256(site.lock)
    assert not (site.venv / PARTIAL).exists()
    assert f"haico env: built {site.venv}: vllm 0.0.1 from {site.lock}" in built.stdout
    python = site.venv / "bin" / "python"
    said = subprocess.run([python, "-c", "import vllm; print(vllm.__file__)"], capture_output=True)
    assert Path(said.stdout.decode().strip()).is_relative_to(site.venv)

    # A second job of the same plan (two `haico env` racing): it finds the venv built.
    plan.write_bytes(kept)
    again = _run_job(site, plan)
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines() == [
        f"haico env: {site.venv} is already built: vllm 0.0.1 from {site.lock} (sha256 "
        f"{_sha256(site.lock)[:12]})",
        "haico env: done",
    ]
    assert json.loads((site.venv / MARKER).read_text()) == marker


@pytest.mark.subprocess
def test_a_build_whose_vllm_does_not_import_fails_and_leaves_no_marker(
    tmp_path: Path,
) -> None:
    wheel = fake_vllm_wheel(tmp_path / "broken", init="raise ImportError('no torch here')\n")
    site = make_env_site(tmp_path, lock_lines=(f"vllm @ {wheel.as_uri()}",))
    done = _job(site, EnvRequest(images=False))
    assert done.returncode == 1
    assert "ImportError: no torch here" in done.stderr
    assert done.stderr.endswith("haico env: import vllm failed (exit 1); its output is above\n")
    assert not (site.venv / MARKER).exists()
    assert (site.venv / PARTIAL).exists()  # so the next `haico env` may rebuild it


@pytest.mark.subprocess
def test_the_job_pulls_each_image_with_the_token_in_the_pull_environment_only(
    tmp_path: Path,
) -> None:
    site = make_env_site(tmp_path)
    done = _job(site, EnvRequest(venv=False))
    assert done.returncode == 0, done.stdout + done.stderr
    pulls = site.pulls()
    assert [pull["argv"][-1] for pull in pulls] == [POSTGRES_IMAGE, BACKEND_IMAGE]
    for pull in pulls:
        assert pull["env"]["APPTAINER_DOCKER_PASSWORD"] == TOKEN
        assert pull["env"]["APPTAINER_DOCKER_USERNAME"] == "haico-bot"
        assert TOKEN not in " ".join(pull["argv"])
        assert TOKEN not in json.dumps(pull["parent_env"])  # the job's own environment
        assert "pytest_haico.site.job" in pull["parent_cmdline"]
    assert TOKEN not in done.stdout + done.stderr
    for sif in site.sifs():
        assert json.loads(sif.read_text())["pulled"].startswith("docker://")
        assert sif.stat().st_mode & 0o777 == 0o644
    assert not list(site.sif_dir.glob(".*partial"))

    again = _job(site, EnvRequest(venv=False))
    assert again.returncode == 0 and len(site.pulls()) == 2  # nothing pulled twice


@pytest.mark.subprocess
def test_a_token_file_loosened_after_planning_is_refused_by_the_job(tmp_path: Path) -> None:
    site = make_env_site(tmp_path)
    cluster = resolve_cluster_site(load_cluster_env(site.cluster_env), site.environ())
    plan = plan_env(cluster, site.experiments, EnvRequest(venv=False), say=lambda line: None)
    write_plan(site.root / "plan.json", plan)
    site.token_file.chmod(0o644)
    done = subprocess.run(
        [sys.executable, "-m", "pytest_haico.site.job", str(site.root / "plan.json")],
        env=site.environ(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (done.returncode, done.stderr) == (
        1,
        f"haico env: REGISTRY_TOKEN_FILE: {site.token_file} is open to its group or others "
        f"(mode 0644): chmod 600 {site.token_file}\n",
    )
    assert site.pulls() == []


def test_a_pull_leaves_this_process_environment_without_the_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = make_env_site(tmp_path)
    # Inherited credentials never reach the pull: only the token file's do.
    monkeypatch.setenv("APPTAINER_DOCKER_PASSWORD", "inherited-not-from-the-file")
    before = dict(os.environ)
    pulled = pull_images(
        [Pull(ref=POSTGRES_IMAGE, sif=site.sifs()[0])],
        token_file=site.token_file,
        user="haico-bot",
        environ=site.environ(),
        say=lambda line: None,
    )
    assert pulled == 1
    assert dict(os.environ) == before
    [pull] = site.pulls()
    assert pull["env"]["APPTAINER_DOCKER_PASSWORD"] == TOKEN


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()
