"""`haico env` against real Slurm daemons: the real-vLLM tier's lock built into a venv by a
job (verified by importing vLLM), a second `haico env` that submits nothing, and the image
pulls in a job through the Apptainer shim, with the registry token in the pull's environment
and nowhere else (not the submission, not the job's environment, not its log)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.site.env_site import TOKEN, EnvSite, make_env_site
from tests.slurm.cluster import SlurmCluster
from tests.vllm.real_vllm import manifest_or_skip
from tests.vllm.setup_tier import LOCK_FILE

REPO = Path(__file__).resolve().parents[2]
# What the user's shell holds and no job may see.
SHELL_SECRETS = {"OPENAI_API_KEY": "sk-haico-env-shell-secret", "APPTAINER_DOCKER_PASSWORD": TOKEN}


def _haico_env(
    site: EnvSite, cluster: SlurmCluster, *args: str
) -> subprocess.CompletedProcess[str]:
    """`python -m pytest_haico env` from the project, as a user's shell runs it."""
    env = {**site.environ(), **cluster.env, **SHELL_SECRETS, "SLURM_MEM_PER_CPU": "7"}
    command = [sys.executable, "-m", "pytest_haico", "env", "--experiments", str(site.experiments)]
    return subprocess.run(
        [*command, *args],
        cwd=site.root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _submitted(done: subprocess.CompletedProcess[str]) -> str:
    match = re.search(r"^haico env: job (\d+) ", done.stdout, re.M)
    assert match, done.stdout + done.stderr
    return match.group(1)


def test_env_pulls_the_images_in_a_job_and_the_token_reaches_only_the_pull(
    tmp_path: Path, slurm_cluster: SlurmCluster
) -> None:
    site = make_env_site(tmp_path)
    site.mark_venv_built()
    done = _haico_env(site, slurm_cluster)
    assert done.returncode == 0, done.stderr
    job = _submitted(done)
    assert slurm_cluster.wait_ended(job, timeout=120) == {job: "COMPLETED"}
    log = (site.work / "haico-env" / f"env-{job}.out").read_text()
    assert log.splitlines()[-1] == "haico env: done", log
    assert TOKEN not in log and TOKEN not in done.stdout + done.stderr
    pulls = site.pulls()
    assert len(pulls) == 2
    for pull in pulls:
        assert pull["env"]["APPTAINER_DOCKER_PASSWORD"] == TOKEN
        assert TOKEN not in " ".join(pull["argv"])
        job_env = pull["parent_env"]  # the job's process, as Slurm started it
        assert job_env["SLURM_JOB_ID"] == job
        assert TOKEN not in json.dumps(job_env)
        assert "OPENAI_API_KEY" not in job_env and "SLURM_MEM_PER_CPU" not in job_env
    assert all(sif.is_file() for sif in site.sifs())
    shown = slurm_cluster.run("scontrol", "show", "job", job).stdout
    assert TOKEN not in shown

    again = _haico_env(site, slurm_cluster)
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines()[-1] == (
        "haico env: nothing to do: the venv and the images are in place"
    )


def test_two_env_commands_at_once_submit_one_job_and_nothing_is_done_twice(
    tmp_path: Path, slurm_cluster: SlurmCluster
) -> None:
    """Two terminals (or a second try while the first job waits in the queue): the second
    sees the first's job and submits nothing; the images are pulled once."""
    site = make_env_site(tmp_path)
    site.mark_venv_built()
    env = {**site.environ(), **slurm_cluster.env, "SLURM_MEM_PER_CPU": "7"}
    command = [sys.executable, "-m", "pytest_haico", "env", "--experiments", str(site.experiments)]
    both = [
        subprocess.Popen(command, cwd=site.root, env=env, stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outs = sorted(process.communicate(timeout=120)[0] for process in both)
    assert [process.returncode for process in both] == [0, 0], outs
    submitted = [out for out in outs if re.search(r"^haico env: job \d+ ", out, re.M)]
    assert len(submitted) == 1, outs
    job = re.findall(r"^haico env: job (\d+) ", submitted[0], re.M)[0]
    [other] = [out for out in outs if out is not submitted[0]]
    # It found the job queued or running, or (had that job already ended) nothing missing.
    assert (
        f"haico env: your job {job} (" in other and "nothing submitted" in other
    ) or other.splitlines()[-1].endswith("in place"), other
    assert slurm_cluster.wait_ended(job, timeout=120) == {job: "COMPLETED"}
    assert len(site.pulls()) == 2  # each image once
    assert slurm_cluster.run("squeue", "-h", "-n", "haico-env").stdout.strip() == ""


@pytest.mark.vllm
def test_env_builds_the_tier_lock_into_a_venv_in_a_job_and_a_rerun_submits_nothing(
    tmp_path: Path, slurm_cluster: SlurmCluster
) -> None:
    manifest = manifest_or_skip()  # the tier's wheels (torch 2.13.0+cpu) are at hand
    site = make_env_site(tmp_path, lock_lines=())
    shutil.copy(LOCK_FILE, site.lock)
    try:
        done = _haico_env(site, slurm_cluster, "--venv-only")
        assert done.returncode == 0, done.stderr
        job = _submitted(done)
        assert f"builds VLLM_VENV={site.venv} from vllm-lock.txt" in done.stdout
        # pip unpacks 3.4 GB of wheels on a shared 2-core machine: minutes.
        states = slurm_cluster.wait_ended(job, timeout=1500)
        log = (site.work / "haico-env" / f"env-{job}.out").read_text()
        assert states == {job: "COMPLETED"}, log[-3000:]
        marker = json.loads((site.venv / ".haico-env.json").read_text())
        assert marker["vllm_version"] == manifest.vllm_version
        assert marker["job_id"] == job
        print(log.splitlines()[-2])  # the build's line, with its time

        again = _haico_env(site, slurm_cluster, "--venv-only")
        assert again.returncode == 0, again.stderr
        assert again.stdout.splitlines() == [
            f"haico env: {site.venv} is up to date: vllm {manifest.vllm_version} from "
            f"{site.lock} (sha256 {marker['sha256'][:12]})",
            "haico env: nothing to do: the venv is in place",
        ]
        assert slurm_cluster.run("squeue", "-h", "-n", "haico-env").stdout.strip() == ""
    finally:
        shutil.rmtree(site.venv, ignore_errors=True)  # 3.4 GB
