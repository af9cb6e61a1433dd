"""`haico serve` under real Slurm daemons, with the stand-in model: the model job registers
once healthy, answers with its key, deregisters on every end (stop, USR1, a crash), and
hands over to its successor when it renews."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from pytest_haico.cli.main import main
from pytest_haico.errors import CatalogueError
from pytest_haico.files import shown_path
from pytest_haico.serve.catalogue import entry_path
from pytest_haico.serve.resolver import ServedModel, resolve_served
from tests.polling import wait_for
from tests.slurm.cluster import SlurmCluster


@pytest.fixture
def project(
    slurm_cluster: SlurmCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Path]:
    """`haico init`'s repository, its CLUSTER_WORK under tmp_path, Slurm's commands pointed
    at the test cluster; every job it leaves is cancelled."""
    root = tmp_path / "project"
    subprocess.run(
        [sys.executable, "-m", "pytest_haico", "init", str(root)], check=True, capture_output=True
    )
    monkeypatch.chdir(root)
    monkeypatch.setenv("CLUSTER_WORK", str(tmp_path / "work"))
    for key, value in slurm_cluster.env.items():
        monkeypatch.setenv(key, value)
    yield root
    jobs = slurm_cluster.run("squeue", "-h", "-n", "haico.serve.standin", "-o", "%i").stdout
    for job in jobs.split():
        slurm_cluster.run("scancel", job)


def _catalogue(project: Path) -> Path:
    return Path(os.environ["CLUSTER_WORK"]) / "catalogue"


def _serve(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    status = main(["serve", *args])
    captured = capsys.readouterr()
    return status, captured.out + captured.err


def _wait_registered(
    catalogue: Path, *, restarts: int = 0, job: str | None = None, timeout: float = 120
) -> ServedModel:
    found: list[ServedModel] = []

    def registered() -> bool:
        try:
            served = resolve_served("standin", catalogue=catalogue)
        except CatalogueError:
            return False
        found.append(served)
        return served.entry.job.restart_count == restarts and job in (None, served.entry.job.id)

    wait_for(registered, timeout=timeout, what="the model job to register")
    return found[-1]


def _job_id(output: str) -> str:
    return output.split("submitted job ", 1)[1].split()[0]


def _submit(capsys: pytest.CaptureFixture[str]) -> str:
    """Serve arm standin on the local profile for 5 minutes; the model job's id."""
    status, out = _serve(capsys, "standin", "--profile", "local", "--time", "5")
    assert status == 0, out
    return _job_id(out)


def test_a_served_model_registers_answers_with_its_key_and_deregisters_when_stopped(
    project: Path, slurm_cluster: SlurmCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    catalogue = _catalogue(project)
    status, out = _serve(capsys, "standin", "--profile", "local", "--time", "5")
    assert status == 0, out
    job = _job_id(out)
    assert f"it registers {shown_path(catalogue)}/standin.json once its model is healthy" in out

    served = _wait_registered(catalogue)
    assert served.entry.job.id == job and served.served_name == "standin"
    assert served.identity.model.startswith("standin:")
    assert served.identity.vllm_version  # from the server's GET /version
    key = served.api_key()
    models = httpx.get(f"{served.endpoint}/models", headers={"Authorization": f"Bearer {key}"})
    assert [m["id"] for m in models.json()["data"]] == ["standin"]
    assert httpx.get(f"{served.endpoint}/models").status_code == 401
    assert key not in entry_path(catalogue, "standin").read_text()

    status, out = _serve(capsys, "--list")
    assert status == 0 and out.startswith(f"standin  {served.endpoint}  served_name=standin"), out
    status, out = _serve(capsys, "status", "standin")
    # It serves on its node's interfaces, under the node's name (for clients elsewhere).
    assert status == 0 and f"  healthy: GET http://{served.entry.job.node}:" in out, out

    status, out = _serve(capsys, "standin", "--profile", "local")
    assert status == 2
    assert f"'standin' is served already, by job {job} at {served.endpoint}" in out

    status, out = _serve(capsys, "stop", "standin")
    assert status == 0, out
    assert out.splitlines()[-1] == "haico: 'standin' deregistered"
    assert list(catalogue.glob("standin*")) == []
    slurm_cluster.wait_ended(job, timeout=60)
    log = (catalogue / "logs" / f"standin.{job}.out").read_text()
    assert "deregistered standin" in log and "stopped (SIGTERM)" in log, log


def test_two_serve_commands_at_once_submit_one_model_job(
    project: Path, slurm_cluster: SlurmCluster
) -> None:
    """Two terminals, or a second try before the first job registered: the second sees the
    first's job (queued or starting) or its entry, and submits nothing."""
    command = [sys.executable, "-m", "pytest_haico", "serve", "standin", "--profile", "local"]
    both = [
        subprocess.Popen(
            [*command, "--time", "5"],
            cwd=project,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for _ in range(2)
    ]
    outs = [process.communicate(timeout=120)[0] for process in both]
    codes = sorted(process.returncode for process in both)
    assert codes == [0, 2], outs
    submitted, refused = sorted(outs, key=lambda out: "submitted job " not in out)
    job = _job_id(submitted)
    assert (
        f"'standin' has your job {job} (" in refused or "'standin' is served already" in refused
    ), refused
    queue = slurm_cluster.run("squeue", "-h", "-n", "haico.serve.standin", "-o", "%i").stdout
    assert queue.split() == [job]


def test_usr1_and_a_crash_of_the_model_server_each_deregister(
    project: Path, slurm_cluster: SlurmCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    catalogue = _catalogue(project)
    job = _submit(capsys)
    _wait_registered(catalogue)
    slurm_cluster.run("scancel", "--batch", "-s", "USR1", job, check=True)
    slurm_cluster.wait_ended(job, timeout=60)
    assert not entry_path(catalogue, "standin").exists()
    assert slurm_cluster.job_fields(job)["ExitCode"] == "0:0"

    job = _submit(capsys)
    served = _wait_registered(catalogue)
    pid = _listening_pid(served.entry.port)
    os.kill(pid, signal.SIGKILL)
    slurm_cluster.wait_ended(job, timeout=60)
    assert not entry_path(catalogue, "standin").exists()
    assert slurm_cluster.job_fields(job)["ExitCode"] == "75:0"
    log = (catalogue / "logs" / f"standin.{job}.out").read_text()
    assert "llm (pid" in log and "ended with status" in log, log


def test_a_model_job_deregisters_at_slurms_warning_before_its_time_limit(
    project: Path, slurm_cluster: SlurmCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    # --time 2: Slurm's USR1, asked 60 s before the end (--signal=B:USR1@60), comes at its
    # first look at the job's time (every 30 s) after a minute: the job ends before its
    # limit, no TIMEOUT. (With --time 1 it could come before the model registered.)
    catalogue = _catalogue(project)
    status, out = _serve(capsys, "standin", "--profile", "local", "--time", "2")
    assert status == 0, out
    job = _job_id(out)
    _wait_registered(catalogue)
    slurm_cluster.wait_ended(job, timeout=180)
    fields = slurm_cluster.job_fields(job)
    assert (fields["JobState"], fields["ExitCode"]) == ("COMPLETED", "0:0"), fields
    assert not entry_path(catalogue, "standin").exists()
    log = (catalogue / "logs" / f"standin.{job}.out").read_text()
    assert "deregistered standin" in log and "stopped (SIGUSR1)" in log, log


def test_a_requeued_model_job_registers_again_on_its_new_port_and_the_next_run_finds_it(
    project: Path, slurm_cluster: SlurmCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    catalogue = _catalogue(project)
    job = _submit(capsys)
    first = _wait_registered(catalogue)
    first_key = first.api_key()
    assert _campaign(project, "--haico-model", "standin").returncode == 0
    slurm_cluster.run("scontrol", "requeue", job, check=True)
    wait_for(
        lambda: not entry_path(catalogue, "standin").exists(),
        timeout=60,
        what="the requeued job to deregister",
    )
    with socket.socket() as taken:  # the old port is taken: the restart must move
        # The old server's listener must be gone; connections it closed may keep the port
        # in TIME_WAIT for a minute, which SO_REUSEADDR binds over (a listener, never).
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        wait_for(lambda: _bound(taken, first.entry.port), timeout=60, what="the old server to stop")
        taken.listen()
        again = _wait_registered(catalogue, restarts=1, timeout=240)
    assert again.entry.job.id == job and again.entry.port != first.entry.port
    key = again.api_key()
    assert key != first_key
    models = httpx.get(f"{again.endpoint}/models", headers={"Authorization": f"Bearer {key}"})
    assert models.status_code == 200
    # The next run (of a new item) resolves the new place.
    (project / "experiments" / "scripts" / "more.yaml").write_text("id: more\nturns: [user: Hi]\n")
    run = _campaign(project, "--haico-model", "standin")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert [r["verdict"] for r in _records(project)] == ["completed"] * 3
    served = [g for g in _gates(project) if g["name"] == "served_model"]
    assert served and f":{again.entry.port}/v1, job {job}" in served[0]["detail"], served


def test_an_entry_left_by_a_killed_job_is_stale_by_its_state_and_stop_removes_it(
    project: Path, slurm_cluster: SlurmCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    catalogue = _catalogue(project)
    job = _submit(capsys)
    _wait_registered(catalogue)
    (serving,) = [p for p in slurm_cluster.processes_of_job(job) if "serve.job" in p]
    os.kill(int(serving.split(":")[0]), signal.SIGKILL)  # no chance to deregister
    slurm_cluster.wait_ended(job, timeout=60)
    assert entry_path(catalogue, "standin").exists()
    with pytest.raises(CatalogueError) as refused:
        resolve_served("standin", catalogue=catalogue)
    assert str(refused.value).startswith(
        f"served model 'standin' is not available: its job {job} is "
    )
    status, out = _serve(capsys, "--list")
    assert out.startswith(f"standin  not available: its job {job} is "), out
    status, out = _serve(capsys, "stop", "standin")
    assert status == 0 and out.startswith("haico: removed the stale entry of 'standin'"), out
    assert list(catalogue.glob("standin*")) == []
    status, out = _serve(capsys, "status", "standin")
    assert status == 2 and out.startswith("haico: no served model named 'standin' in "), out


def _bound(sock: socket.socket, port: int) -> bool:
    try:
        sock.bind(("127.0.0.1", port))
    except OSError:
        return False
    return True


def _listening_pid(port: int) -> int:
    """The pid of the process listening on 127.0.0.1:`port` (from /proc/net/tcp)."""
    inodes = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[1].endswith(f":{port:04X}") and fields[3] == "0A":
            inodes.add(fields[9])
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            links = {os.readlink(fd) for fd in (proc / "fd").iterdir()}
        except OSError:
            continue
        if any(f"socket:[{inode}]" in links for inode in inodes):
            return int(proc.name)
    raise AssertionError(f"nothing listens on port {port}")


def _campaign(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`pytest experiments` of the project in a process of its own, as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "pytest", "experiments", "--haico-exit", "campaign", *args],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _results(project: Path) -> Path:
    """The results root: $CLUSTER_WORK/results, as for every run of the project."""
    return Path(os.environ["CLUSTER_WORK"]) / "results"


def _records(project: Path) -> list[dict[str, Any]]:
    ledger = _results(project) / "default" / "standin" / "ledger"
    return [
        json.loads(line)
        for path in sorted(ledger.glob("*.jsonl"))
        for line in path.read_text().splitlines()
        if line.strip()
    ]


def test_a_campaign_attaches_by_name_and_its_items_are_the_arms_own(
    project: Path, slurm_cluster: SlurmCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    job = _submit(capsys)
    _wait_registered(_catalogue(project))
    run = _campaign(project, "--haico-model", "standin")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    records = _records(project)
    assert [r["verdict"] for r in records] == ["completed", "completed"]
    served = next(g for g in _gates(project) if g["name"] == "served_model")
    assert served["passed"] and f"job {job}" in served["detail"], served
    # A served model and the same model started by the run are the same items.
    again = _campaign(project)
    assert again.returncode == 0 and "2 done in ledger, 0 to run" in again.stdout, again.stdout


def test_a_served_model_of_another_configuration_is_gate_78_naming_the_difference(
    project: Path, slurm_cluster: SlurmCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    _submit(capsys)
    _wait_registered(_catalogue(project))
    arm = project / "experiments" / "arms" / "standin.toml"
    arm.write_text(arm.read_text().replace("max_model_len = 8192", "max_model_len = 4096"))
    run = _campaign(project, "--haico-model", "standin")
    assert run.returncode == 78, run.stdout[-3000:]
    assert "vllm.max_model_len: served 8192, the arm's 4096" in run.stdout + run.stderr, run.stdout[
        -3000:
    ]
    assert _records(project) == []


def test_a_model_job_that_ends_mid_campaign_ends_its_conversations_as_infra_75(
    project: Path, slurm_cluster: SlurmCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    arm = project / "experiments" / "arms" / "standin.toml"
    slow = arm.read_text().replace('persona = "helpful"', 'persona = "helpful"\nlatency_ms = 3000')
    arm.write_text(slow.replace("concurrency = 4", "concurrency = 1"))
    job = _submit(capsys)
    _wait_registered(_catalogue(project))
    campaign = subprocess.Popen(
        [sys.executable, "-m", "pytest", "experiments", "--haico-exit", "campaign",
         "--haico-model", "standin", "--haico-progress", "lines"],
        cwd=project, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        wait_for(lambda: _canary_passed(project), timeout=120, what="the dynamic gates")
        slurm_cluster.run("scancel", job, check=True)
        out, _ = campaign.communicate(timeout=300)
    finally:
        campaign.kill()
    assert campaign.returncode == 75, out[-3000:]
    assert "infra_error" in {r["verdict"] for r in _records(project)}, out[-3000:]


def _gates(project: Path) -> list[dict[str, Any]]:
    """The gates of the project's newest run, as gates.json has them so far."""
    found = list(_results(project).glob("default/standin/runs/*/gates.json"))
    if not found:
        return []
    try:
        newest = max(found, key=lambda path: path.stat().st_mtime)
        gates: list[dict[str, Any]] = json.loads(newest.read_text())["gates"]
    except ValueError:
        return []
    return gates


def _canary_passed(project: Path) -> bool:
    return any(g["name"] == "canary_turn" and g["passed"] for g in _gates(project))


def test_a_renewed_model_job_hands_over_to_its_successor_and_stop_ends_the_chain(
    project: Path, slurm_cluster: SlurmCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    """--time 3 --until 10 --renew-lead 2: the successor is eligible 1 min after the first
    job started; it registers, the first drains and ends, `stop` cancels the next one."""
    catalogue, logs = _catalogue(project), _catalogue(project) / "logs"
    status, out = _serve(
        capsys, "standin", "--profile", "local", "--time", "3", "--until", "10",
        "--renew-lead", "2",
    )  # fmt: skip
    assert status == 0 and "its successor is queued to start 2 min before its end" in out, out
    first_job = _job_id(out)
    first = _wait_registered(catalogue)
    second_job = _queued_successor(logs / f"standin.{first_job}.out")
    assert slurm_cluster.job_fields(second_job)["Dependency"].startswith(f"after:{first_job}+1")

    second = _wait_registered(catalogue, job=second_job, timeout=180)
    assert second.entry.port != first.entry.port
    slurm_cluster.wait_ended(first_job, timeout=120)
    assert slurm_cluster.job_fields(first_job)["ExitCode"] == "0:0"
    first_log = (logs / f"standin.{first_job}.out").read_text()
    assert f"replaced by job {second_job}: draining" in first_log, first_log
    assert f"stopped (replaced by job {second_job})" in first_log, first_log
    served = resolve_served("standin", catalogue=catalogue)  # a client, after the switch
    assert served.entry.job.id == second_job and served.endpoint == second.endpoint
    headers = {"Authorization": f"Bearer {served.api_key()}"}
    assert httpx.get(f"{served.endpoint}/models", headers=headers).status_code == 200

    third_job = _queued_successor(logs / f"standin.{second_job}.out")
    status, out = _serve(capsys, "--list")
    assert out.splitlines()[1].endswith(f"also in the queue: job {third_job} PENDING"), out
    status, out = _serve(capsys, "stop", "standin")
    assert status == 0, out
    assert out.splitlines()[-1] == f"haico: cancelled job {third_job} of 'standin' (PENDING)"
    slurm_cluster.wait_ended(second_job, third_job, timeout=60)
    assert slurm_cluster.run("squeue", "-h", "-n", "haico.serve.standin").stdout == ""
    assert list(catalogue.glob("standin*")) == []


def _queued_successor(log: Path) -> str:
    """The id of the successor that the job of `log` queued, once it says so."""
    said: list[str] = []

    def queued() -> bool:
        text = log.read_text() if log.exists() else ""
        said[:] = text.split("renewal: queued job ", 1)[1:]
        return bool(said)

    wait_for(queued, timeout=120, what=f"{log.name} to queue its successor")
    return said[0].split()[0]


def test_stop_cancels_a_queued_successor_of_a_name_with_no_entry(
    project: Path, slurm_cluster: SlurmCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    """A chain whose job ended (a crash) leaves its successor queued: stop finds it by name."""
    _catalogue(project).mkdir(mode=0o750, parents=True)
    queued = slurm_cluster.run(
        "sbatch", "--parsable", "--hold", "--job-name=haico.serve.standin", "--wrap=true",
        check=True,
    ).stdout.strip()  # fmt: skip
    status, out = _serve(capsys, "stop", "standin")
    assert (status, out) == (0, f"haico: cancelled job {queued} of 'standin' (PENDING)\n")
    slurm_cluster.wait_ended(queued, timeout=60)
    status, out = _serve(capsys, "stop", "standin")
    assert status == 2 and out.startswith("haico: no served model named 'standin' in "), out
