"""Self-chaining campaign jobs (HAICO_CHAIN) and `afterok` dependents, under real Slurm daemons.

The cause of exit 75 here is the simplest real one: the stand-in model of persona `flaky`
fails the same requests every time, so `greet` fails on infrastructure on every attempt
while `compare-queues` completes; with `--haico-max-attempts 2` the first run owes a
retry (75) and the second records `gave_up` and finishes (0).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.polling import wait_for
from tests.slurm.cluster import SlurmCluster

REPO = Path(__file__).resolve().parents[2]
WRAPPER = REPO / "sbatch" / "campaign.sbatch"
FINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "PREEMPTED", "NODE_FAIL", "OUT_OF_MEMORY"}
# One item that fails on infrastructure on every attempt, one that completes.
FLAKY_PAIR = ("experiments", "-k", "greet or compare", "--haico-max-attempts")
CHAIN_TIMEOUT = 300.0


def _project(tmp_path: Path, *, persona: str) -> Path:
    """A copy of the demo campaign whose stand-in model has `persona`."""
    root = tmp_path / "project"
    shutil.copytree(REPO / "experiments", root / "experiments")
    arm = root / "experiments" / "arms" / "demo.toml"
    arm.write_text(arm.read_text().replace('persona = "helpful"', f'persona = "{persona}"'))
    (root / "pyproject.toml").write_text(
        '[tool.pytest.ini_options]\nasyncio_default_fixture_loop_scope = "function"\n'
        'addopts = ["-p", "no:langsmith_plugin"]\n'
    )
    return root


def _sbatch(
    cluster: SlurmCluster,
    project: Path,
    *args: str,
    name: str,
    env: dict[str, str] | None = None,
    script_args: tuple[str, ...] = (),
) -> str:
    """Submit the wrapper with `script_args` (or, given `--wrap=...` in `args`, no script)."""
    exports = ",".join(
        f"{k}={v}" for k, v in {"HAICO_PYTHON": sys.executable, **(env or {})}.items()
    )
    output = "--output=job-%A_%a.out" if any(a.startswith("--array") for a in args) else None
    result = cluster.run(
        "sbatch",
        "--parsable",
        f"--job-name={name}",
        f"--chdir={project}",
        f"--export=ALL,{exports}",
        output or "--output=job-%j.out",
        "--time=15",
        *args,
        *([] if any(a.startswith("--wrap") for a in args) else [str(WRAPPER), *script_args]),
        check=True,
    )
    return result.stdout.strip().split(";")[0]


def _jobs(cluster: SlurmCluster, name: str) -> dict[str, tuple[str, str]]:
    """Job id (ARRAY_TASK for array tasks) -> (state, reason) of every job named `name`."""
    out = cluster.run("squeue", "-h", "-r", "-t", "all", f"--name={name}", "-o", "%i|%T|%r").stdout
    return {
        job: (state, reason)
        for job, state, reason in (line.split("|") for line in out.splitlines() if line)
    }


def _wait_ended(cluster: SlurmCluster, name: str, count: int) -> dict[str, tuple[str, str]]:
    """The jobs named `name` once there are `count` of them and none will run any more."""
    jobs: dict[str, tuple[str, str]] = {}

    def ended() -> bool:
        nonlocal jobs
        jobs = _jobs(cluster, name)
        return len(jobs) >= count and all(state in FINAL for state, _ in jobs.values())

    wait_for(ended, timeout=CHAIN_TIMEOUT, what=f"{count} jobs named {name} to end")
    return jobs


def _exit_code(cluster: SlurmCluster, job: str) -> str:
    line = cluster.run("scontrol", "show", "job", "-o", job, check=True).stdout
    return line.split(" ExitCode=", 1)[1].split()[0]


def _log(project: Path, job: str) -> str:
    path = project / f"job-{job}.out"
    return path.read_text() if path.exists() else f"(no {path.name})"


def _logs(project: Path) -> str:
    return "\n".join(f"== {p.name}\n{p.read_text()}" for p in sorted(project.glob("job-*.out")))


def _records(project: Path) -> list[dict[str, Any]]:
    ledger = project / "results" / "default" / "demo" / "ledger"
    return [
        json.loads(line)
        for path in sorted(ledger.glob("*.jsonl"))
        for line in path.read_text().splitlines()
        if line.strip()
    ]


def _history(project: Path) -> dict[str, list[tuple[str, str]]]:
    """Script -> [(run_id, verdict)] in ledger order."""
    history: dict[str, list[tuple[str, str]]] = {}
    for record in sorted(_records(project), key=lambda r: str(r["finished_at"])):
        history.setdefault(record["script"], []).append((record["run_id"], record["verdict"]))
    return history


def _bad_tmpdir(tmp_path: Path) -> Path:
    """A TMPDIR whose pytest-haico state directory others may write (another user made it,
    or a umask of 000 did): the plugin refuses it, so the stack cannot start."""
    tmpdir = tmp_path / "tmp"
    state = tmpdir / f"pytest-haico-{os.getuid()}"
    state.mkdir(parents=True)
    state.chmod(0o777)
    return tmpdir


def test_chain_continues_a_link_that_ended_75_until_the_share_is_finished(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    project = _project(tmp_path, persona="flaky")
    first = _sbatch(
        slurm_cluster,
        project,
        name="chain-continues",
        env={"HAICO_CHAIN": "2"},
        script_args=(*FLAKY_PAIR, "2"),
    )
    jobs = _wait_ended(slurm_cluster, "chain-continues", 3)
    logs = _logs(project)
    second, third = sorted((j for j in jobs if j != first), key=int)
    assert jobs[first][0] == "FAILED", logs
    assert _exit_code(slurm_cluster, first) == "75:0"
    assert jobs[second][0] == "COMPLETED", logs
    # The third link was queued, then cancelled by Slurm once the second ended OK.
    assert jobs[third] == ("CANCELLED", "DependencyNeverSatisfied"), logs
    assert not (project / f"job-{third}.out").exists()

    first_log, second_log = _log(project, first), _log(project, second)
    assert f"haico: chain: link 1 of 3 (job {first})" in first_log
    assert (
        f"haico: chain: queued job {second} to continue this job if it ends 75, TIMEOUT, "
        "PREEMPTED or NODE_FAIL"
    ) in first_log
    assert f"haico: chain: link 2 of 3 (job {second})" in second_log
    assert f"haico: chain: job {first} ended FAILED 75:0: continuing it" in second_log
    assert f"haico: chain: queued job {third} to continue" in second_log
    # The same arguments: -k "greet or compare" stayed one argument.
    assert "haico: 1 done in ledger, 1 to run (1 retries)" in second_log

    assert _history(project) == {
        "greet": [(f"{first}.1", "infra_error"), (f"{second}.1", "gave_up")],
        "compare-queues": [(f"{first}.1", "completed")],
    }


def test_chain_link_that_finishes_leaves_no_successor_pending_or_running(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    project = _project(tmp_path, persona="helpful")
    first = _sbatch(
        slurm_cluster,
        project,
        name="chain-finishes",
        env={"HAICO_CHAIN": "2"},
        script_args=("experiments", "-k", "greet"),
    )
    jobs = _wait_ended(slurm_cluster, "chain-finishes", 2)
    logs = _logs(project)
    assert jobs[first][0] == "COMPLETED", logs
    (successor,) = (j for j in jobs if j != first)
    assert jobs[successor] == ("CANCELLED", "DependencyNeverSatisfied"), logs
    pending = slurm_cluster.run("squeue", "-h", "--name=chain-finishes", "-t", "PD,R,CG").stdout
    assert pending.strip() == ""
    assert not (project / f"job-{successor}.out").exists()
    assert [r["verdict"] for r in _records(project)] == ["completed"]


def test_chain_queues_no_more_successors_than_haico_chain(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    project = _project(tmp_path, persona="flaky")
    first = _sbatch(
        slurm_cluster,
        project,
        name="chain-bounded",
        env={"HAICO_CHAIN": "1"},
        script_args=(*FLAKY_PAIR, "3"),  # greet still owes a retry after the second link
    )
    jobs = _wait_ended(slurm_cluster, "chain-bounded", 2)
    logs = _logs(project)
    assert len(jobs) == 2, logs
    (second,) = (j for j in jobs if j != first)
    assert [jobs[first][0], jobs[second][0]] == ["FAILED", "FAILED"], logs
    assert _exit_code(slurm_cluster, second) == "75:0"
    second_log = _log(project, second)
    assert f"haico: chain: link 2 of 2 (job {second})" in second_log
    assert "haico: chain: the last link, no successor" in second_log
    assert "queued job" not in second_log
    assert _history(project)["greet"] == [
        (f"{first}.1", "infra_error"),
        (f"{second}.1", "infra_error"),
    ]


def test_chain_ends_when_its_total_walltime_cap_is_reached(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    project = _project(tmp_path, persona="flaky")
    first = _sbatch(
        slurm_cluster,
        project,
        name="chain-capped",
        env={"HAICO_CHAIN": "3", "HAICO_CHAIN_MAX_S": "1"},
        script_args=(*FLAKY_PAIR, "2"),
    )
    jobs = _wait_ended(slurm_cluster, "chain-capped", 2)
    logs = _logs(project)
    assert len(jobs) == 2, logs
    (second,) = (j for j in jobs if j != first)
    assert jobs[second][0] == "COMPLETED", logs
    second_log = _log(project, second)
    assert f"haico: chain: job {first} ended FAILED 75:0: continuing it" in second_log
    assert "since its first link started, HAICO_CHAIN_MAX_S=1; resubmit by hand" in second_log
    assert "done in ledger" not in second_log
    # Nothing ran in the second link: greet still owes its retry.
    assert _history(project)["greet"] == [(f"{first}.1", "infra_error")]


def test_chain_ends_after_a_link_that_failed_for_another_reason(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    project = _project(tmp_path, persona="helpful")
    tmpdir = _bad_tmpdir(tmp_path)
    first = _sbatch(
        slurm_cluster,
        project,
        name="chain-stack-failed",
        env={"HAICO_CHAIN": "2", "TMPDIR": str(tmpdir)},
        script_args=("experiments", "-k", "greet"),
    )
    jobs = _wait_ended(slurm_cluster, "chain-stack-failed", 2)
    logs = _logs(project)
    assert len(jobs) == 2, logs
    (second,) = (j for j in jobs if j != first)
    assert _exit_code(slurm_cluster, first) == "78:0", logs
    # afternotok started the successor (78 is not OK); it read why and stopped at once.
    assert jobs[second][0] == "COMPLETED", logs
    assert (
        f"haico: chain ends: job {first} ended FAILED 78:0, not with exit 75, TIMEOUT, "
        "PREEMPTED or NODE_FAIL"
    ) in _log(project, second)
    assert "queued job" not in _log(project, second)


def test_chain_in_an_array_continues_each_task_with_its_own_shard(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    project = _project(tmp_path, persona="flaky")
    array = _sbatch(
        slurm_cluster,
        project,
        "--array=0-1",
        name="chain-array",
        env={"HAICO_CHAIN": "1"},
        script_args=(*FLAKY_PAIR, "2"),
    )
    jobs = _wait_ended(slurm_cluster, "chain-array", 4)
    logs = _logs(project)
    tasks = {j: s for j, (s, _) in jobs.items() if j.startswith(f"{array}_")}
    successors = {j: s for j, (s, _) in jobs.items() if "_" not in j}
    assert len(tasks) == 2 and len(successors) == 2, logs
    # The task whose share holds greet owes a retry; only its successor runs.
    (owing,) = (t for t, s in tasks.items() if s == "FAILED")
    assert sorted(successors.values()) == ["CANCELLED", "COMPLETED"], logs
    (ran,) = (j for j, s in successors.items() if s == "COMPLETED")
    log = _log(project, ran)
    task = owing.split("_")[1]
    assert f"haico: chain: job {owing} ended FAILED 75:0: continuing it" in log
    assert f"shard {task}/2" in log  # the successor is no array task: its shard was passed on
    assert _history(project)["greet"][-1] == (f"{ran}.1", "gave_up")


def test_requeued_chain_link_does_not_queue_a_second_successor(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    project = _project(tmp_path, persona="helpful")
    first = _sbatch(
        slurm_cluster,
        project,
        name="chain-requeued",
        env={"HAICO_CHAIN": "1"},
        script_args=("experiments", "-k", "greet"),
    )
    wait_for(
        lambda: "queued job" in _log(project, first),
        timeout=60,
        what=f"job {first} to queue its successor",
    )
    slurm_cluster.run("scontrol", "requeue", first, check=True)
    # It runs again after cred_expire + 1 s (6 s here). `scontrol update StartTime=now` would
    # be sooner, but right after the requeue it makes Slurm kill the job: "Job credential
    # revoked", FAILED 1.
    wait_for(
        lambda: "a restart of job" in _log(project, first),
        timeout=60,
        what=f"job {first} to start again",
    )
    jobs = _wait_ended(slurm_cluster, "chain-requeued", 2)
    logs = _logs(project)
    assert len(jobs) == 2, logs
    assert jobs[first][0] == "COMPLETED", logs
    (successor,) = (j for j in jobs if j != first)
    assert jobs[successor] == ("CANCELLED", "DependencyNeverSatisfied"), logs
    assert f"haico: chain: a restart of job {first}: its first start queued its successor" in _log(
        project, first
    )
    assert _log(project, first).count("queued job") == 1


def test_chain_ends_when_how_its_predecessor_ended_is_unknown(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    project = _project(tmp_path, persona="helpful")
    job = _sbatch(
        slurm_cluster,
        project,
        name="chain-unknown",
        env={"HAICO_CHAIN": "1", "HAICO_CHAIN_PREV": "999999", "HAICO_PYTHON": "/bin/false"},
        script_args=("experiments",),
    )
    jobs = _wait_ended(slurm_cluster, "chain-unknown", 1)
    assert jobs[job][0] == "COMPLETED"
    assert (
        "haico: chain ends: how job 999999 ended is unknown (no sacct, no job completion log, "
        "no controller record); resubmit by hand"
    ) in _log(project, job)


def test_chain_outside_a_batch_job_queues_nothing(slurm_cluster: SlurmCluster) -> None:
    # HAICO_PYTHON=/bin/true stands for a pytest run that finished.
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env |= {**slurm_cluster.env, "HAICO_CHAIN": "2", "HAICO_PYTHON": "/bin/true"}
    plain = subprocess.run(
        ["bash", str(WRAPPER)], env=env, capture_output=True, text=True, timeout=60
    )
    assert plain.returncode == 0, plain.stderr
    assert "haico: chain: HAICO_CHAIN needs a batch job (no SLURM_JOB_ID): no successor" in (
        plain.stderr
    )
    in_salloc = subprocess.run(
        ["salloc", "-N1", "--time=1", "--job-name=chain-salloc", "bash", str(WRAPPER)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert in_salloc.returncode == 0, in_salloc.stderr
    assert "is no batch job (salloc?): no successor" in in_salloc.stderr
    assert len(_jobs(slurm_cluster, "chain-salloc")) == 1


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("HAICO_CHAIN", "two", "haico: HAICO_CHAIN=two is not a number of follow-up jobs"),
        ("HAICO_CHAIN_MAX_S", "1h", "haico: HAICO_CHAIN_MAX_S=1h is not a number of seconds"),
    ],
)
def test_chain_settings_that_are_not_numbers_are_usage_errors(
    slurm_cluster: SlurmCluster, tmp_path: Path, variable: str, value: str, message: str
) -> None:
    project = _project(tmp_path, persona="helpful")
    name = f"chain-bad-{variable.lower()}"
    job = _sbatch(
        slurm_cluster,
        project,
        name=name,
        env={"HAICO_CHAIN": "1", variable: value},
        script_args=("experiments",),
    )
    jobs = _wait_ended(slurm_cluster, name, 1)
    assert len(jobs) == 1
    assert _exit_code(slurm_cluster, job) == "4:0"
    assert message in _log(project, job)
    assert not (project / "results").exists()


def test_smoke_job_of_a_looping_model_exits_0_so_its_afterok_dependent_starts(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    project = _project(tmp_path, persona="looper")
    smoke = _sbatch(
        slurm_cluster, project, name="smoke-looper", script_args=("experiments", "-m", "smoke")
    )
    dependent = _sbatch(
        slurm_cluster,
        project,
        f"--dependency=afterok:{smoke}",
        "--wrap=true",
        name="smoke-looper",
    )
    jobs = _wait_ended(slurm_cluster, "smoke-looper", 2)
    logs = _logs(project)
    assert jobs[smoke][0] == "COMPLETED", logs
    assert jobs[dependent][0] == "COMPLETED", logs
    verdicts = [r["verdict"] for r in _records(project)]
    assert verdicts == ["recursion_limit"] * 3, logs


def test_job_whose_stack_cannot_start_exits_78_and_its_afterok_dependent_is_cancelled(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    project = _project(tmp_path, persona="helpful")
    tmpdir = _bad_tmpdir(tmp_path)
    job = _sbatch(
        slurm_cluster,
        project,
        name="stack-fails",
        env={"TMPDIR": str(tmpdir)},
        script_args=("experiments", "-m", "smoke"),
    )
    dependent = _sbatch(
        slurm_cluster,
        project,
        f"--dependency=afterok:{job}",
        "--wrap=true",
        name="stack-fails",
    )
    jobs = _wait_ended(slurm_cluster, "stack-fails", 2)
    logs = _logs(project)
    assert jobs[job][0] == "FAILED", logs
    assert _exit_code(slurm_cluster, job) == "78:0"
    assert "stack failed (exit 78)" in _log(project, job)
    assert f"state directory {tmpdir}/pytest-haico-{os.getuid()} is writable" in _log(project, job)
    assert jobs[dependent] == ("CANCELLED", "DependencyNeverSatisfied"), logs
    assert _records(project) == []
