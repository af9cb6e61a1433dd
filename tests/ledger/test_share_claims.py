"""Two runs of the same arm and shard at once (a double sbatch): the second is refused
before anything starts, naming the first; a dead holder's claim is taken over."""

from __future__ import annotations

import json
import os
import signal
import socket
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest

from pytest_haico.config.experiment import Arm
from pytest_haico.config.settings import Profile, Settings
from pytest_haico.config.shard import Shard
from pytest_haico.config.slurm import SlurmJob
from pytest_haico.errors import ConfigError, ResultsError, ShareClaimedError
from pytest_haico.gates.result import GateFailedError
from pytest_haico.ledger import claims
from pytest_haico.ledger.claims import Holder, claim_share
from pytest_haico.ledger.recorder import Recorder
from pytest_haico.runner.preflight import ArmPreflights
from tests.harness import BackgroundRun, CampaignProject

# Each item waits until the gate file exists, so the first run holds its claim for as
# long as the test needs.
GATED_TEST = """
import os
import time


def test_conversation(haico_item):
    gate = os.environ.get("HAICO_TEST_GATE")
    if gate:
        open(gate + ".started", "w").close()
    deadline = time.monotonic() + 120
    while gate and not os.path.exists(gate):
        assert time.monotonic() < deadline, "the test never opened the gate"
        time.sleep(0.01)
"""
HOST = socket.gethostname()
SHARE = "arm demo, shard 0/1, stratum default"


def gated_campaign(campaign: CampaignProject) -> None:
    campaign.arm("demo")
    campaign.simple_scripts("a", "b", "c")
    campaign.write("test_conversations.py", GATED_TEST)


def gate_env(job_id: str, gate: Path) -> dict[str, str]:
    return {"SLURM_JOB_ID": job_id, "HAICO_TEST_GATE": str(gate)}


def wait_for_first_item(run: BackgroundRun, gate: Path) -> None:
    started = gate.with_name(gate.name + ".started")
    run.wait_for(started.exists, timeout=60, what="the first run to start its first item")


def claim_path(campaign: CampaignProject) -> Path:
    return campaign.arm_dir("demo") / "claims" / "shard-0of1.default.json"


@pytest.mark.subprocess
def test_a_second_run_of_the_same_share_is_refused_naming_the_first(
    campaign: CampaignProject, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gated_campaign(campaign)
    gate = tmp_path / "gate"
    first = campaign.start(env=gate_env("1001", gate))
    try:
        wait_for_first_item(first, gate)
        monkeypatch.setenv("SLURM_JOB_ID", "1002")
        second = campaign.run()
    finally:
        gate.touch()
        first.wait(timeout=120)
    assert first.process.returncode == 0, first.output()

    assert second.ret == pytest.ExitCode.USAGE_ERROR, second.stdout.str() + second.stderr.str()
    second.stderr.fnmatch_lines(
        [
            f"ERROR: haico: {SHARE} is being run by run 1001.1 (host {HOST}, pid {first.pid}, "
            "Slurm job 1001, since 20*+00:00); a second run would run its items again. Let that "
            "run finish or cancel it; if it is dead (e.g. its node failed), remove "
            f"{claim_path(campaign)}, then rerun",
        ]
    )
    assert [r["run_id"] for r in campaign.records("demo")] == ["1001.1"] * 3
    runs = campaign.arm_dir("demo") / "runs"
    assert sorted(p.name for p in runs.iterdir()) == ["1001.1"], "the refused run left a run"
    assert not claim_path(campaign).exists(), "the first run kept its claim after it ended"


@pytest.mark.subprocess
def test_the_claim_of_a_run_killed_with_kill_9_is_taken_over(
    campaign: CampaignProject, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gated_campaign(campaign)
    gate = tmp_path / "never"
    first = campaign.start(env=gate_env("2001", gate))
    try:
        wait_for_first_item(first, gate)
    finally:
        os.kill(first.pid, signal.SIGKILL)
        first.wait(timeout=30)
    assert json.loads(claim_path(campaign).read_text())["pid"] == first.pid

    monkeypatch.setenv("SLURM_JOB_ID", "2002")
    second = campaign.run()
    assert second.ret == 0, second.stdout.str() + second.stderr.str()
    assert [r["run_id"] for r in campaign.records("demo")] == ["2002.1"] * 3


# -- when a claim is stale -----------------------------------------------------------------


def me(*, job: str | None = "300", restarts: int = 0, run_id: str = "300.1") -> Holder:
    job_env = {"SLURM_JOB_ID": job or "", "SLURM_RESTART_COUNT": str(restarts)}
    return Holder.current(SlurmJob.from_environ(job_env), run_id)


def write_claim(path: Path, **fields: object) -> Path:
    holder = {**json.loads(me().to_json()), **fields}
    path.write_text(json.dumps(holder))
    return path


def test_a_live_holder_on_this_host_keeps_its_claim(tmp_path: Path) -> None:
    path = write_claim(tmp_path / "c.json", job="100", run_id="100.1")
    with pytest.raises(ShareClaimedError) as refused:
        claim_share(path, me(), share=SHARE, file_mode=0o640)
    holder = refused.value.holder
    assert isinstance(holder, Holder) and holder.run_id == "100.1"
    assert json.loads(path.read_text())["run_id"] == "100.1"


@pytest.mark.parametrize(
    "holder",
    [
        pytest.param({"pid": 2**22 + 7}, id="its-pid-is-gone"),
        pytest.param({"start_time": -1}, id="its-pid-was-reused"),
        pytest.param({"boot_id": "another boot"}, id="the-host-rebooted"),
        pytest.param(
            {"host": "node-elsewhere", "job": "300", "restart_count": 0},
            id="this-job-before-its-requeue",
        ),
        pytest.param({"pid": "garbage"}, id="not-a-claim"),
    ],
)
def test_a_dead_holders_claim_is_taken_over(tmp_path: Path, holder: dict[str, object]) -> None:
    path = write_claim(tmp_path / "c.json", run_id="old.1", **holder)
    claim = claim_share(path, me(restarts=1, run_id="300r1.1"), share=SHARE, file_mode=0o640)
    assert json.loads(path.read_text())["run_id"] == "300r1.1"
    claim.release()
    assert not path.exists()


def test_a_holder_on_another_host_is_presumed_alive(tmp_path: Path) -> None:
    path = write_claim(tmp_path / "c.json", host="node-elsewhere", job="299", pid=1)
    with pytest.raises(ShareClaimedError):
        claim_share(path, me(), share=SHARE, file_mode=0o640)


def test_a_claim_written_by_a_later_version_is_read(tmp_path: Path) -> None:
    path = write_claim(tmp_path / "c.json", run_id="100.1", gpu="H100")
    with pytest.raises(ShareClaimedError):
        claim_share(path, me(), share=SHARE, file_mode=0o640)


def test_release_leaves_a_claim_that_is_no_longer_ours(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    claim = claim_share(path, me(), share=SHARE, file_mode=0o640)
    write_claim(path, run_id="taken-over.1")
    claim.release()
    assert json.loads(path.read_text())["run_id"] == "taken-over.1"


def test_a_claim_that_cannot_be_taken_after_several_tries_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_claim(tmp_path / "c.json", pid=2**22 + 7)
    # As if another run took the stale claim each time this one had broken it.
    monkeypatch.setattr(claims, "_break", lambda path, stale: None)
    with pytest.raises(ResultsError) as failed:
        claim_share(path, me(), share=SHARE, file_mode=0o640)
    assert str(failed.value) == (
        f"{SHARE}: could not take the claim {path}: other runs kept taking it; find what "
        "else runs this share (squeue, ps), then rerun"
    )


def test_the_claim_of_the_job_a_chain_continues_is_taken_over(tmp_path: Path) -> None:
    """A chained job killed hard at its walltime left its claim on another node; its
    successor (started by Slurm only once it ended) takes the claim over."""
    path = write_claim(tmp_path / "c.json", host="node-elsewhere", job="299", run_id="299.1")
    successor = Holder.current(
        SlurmJob.from_environ({"SLURM_JOB_ID": "300", "HAICO_CHAIN_PREV": "299"}), "300.1"
    )
    claim = claim_share(path, successor, share=SHARE, file_mode=0o640)
    assert json.loads(path.read_text())["ended"] == ["299"]
    claim.release()
    # Any other job on another host is still presumed alive.
    path = write_claim(tmp_path / "d.json", host="node-elsewhere", job="298", run_id="298.1")
    with pytest.raises(ShareClaimedError):
        claim_share(path, successor, share=SHARE, file_mode=0o640)


@pytest.mark.parametrize("value", ["a/b", "12_", "_3", "12_x", "../1", "12:13"])
def test_a_chain_predecessor_that_is_not_a_job_is_refused(value: str) -> None:
    with pytest.raises(ConfigError, match="HAICO_CHAIN_PREV"):
        SlurmJob.from_environ({"HAICO_CHAIN_PREV": value})


def test_a_run_whose_share_a_requeue_of_its_job_took_sees_who_took_it(tmp_path: Path) -> None:
    """The node's slurmd died, Slurm requeued the job elsewhere, the first run lives on:
    the requeued run breaks its claim, and the first run is told at its next record."""
    path = tmp_path / "share.claim"
    job = SlurmJob(job_id="7", array_job_id="7", array_task_id="0", restart_count=0, node="n1")
    first = claim_share(path, Holder.current(job, "7_0.1"), share="s", file_mode=0o600)
    assert first.taken_by() is None
    requeued = SlurmJob(job_id="7", array_job_id="7", array_task_id="0", restart_count=1, node="n2")
    on_n2 = replace(Holder.current(requeued, "7_0r1.1"), host="n2")  # elsewhere: it cannot
    again = claim_share(path, on_n2, share="s", file_mode=0o600)  # see the first run alive
    assert first.taken_by() == on_n2.describe()
    assert again.taken_by() is None
    first.release()  # leaves the requeued run's claim alone
    assert path.read_bytes() == again.content


def test_gate_output_collision_fails_once_a_requeue_of_the_job_took_the_share(
    tmp_path: Path,
) -> None:
    """The share was this run's at collection; a requeue elsewhere took it before the arm
    started: the arm's start fails gate output_collision, naming that run and the claim."""
    job = SlurmJob(job_id="7", array_job_id=None, array_task_id=None, restart_count=0, node="n1")
    recorder = Recorder(campaign_dir=tmp_path / "default", campaign="default", job=job,
                        max_attempts=3)  # fmt: skip
    recorder.claim("demo", ["default"])
    assert recorder.share_taken("demo") is None
    requeued = replace(Holder.current(replace(job, restart_count=1), "7r1.1"), host="n2")
    path = recorder.paths("demo").share_claim(Shard(0, 1), "default", list_key=None)
    claim_share(path, requeued, share=SHARE, file_mode=0o640)
    settings = SimpleNamespace(
        profile=Profile.LOCAL, site=None, model_endpoint=None, attach=None, backend_image=None,
        backend_cmd=None, drain_timeout=120.0, results_mode=0o640, experiments=tmp_path,
        cluster_env=None, model=None,
    )  # fmt: skip
    preflights = ArmPreflights(cast(Settings, settings), {"demo": Arm(name="demo")}, recorder)
    with pytest.raises(GateFailedError) as failed:
        preflights.run("demo", [])
    assert str(failed.value) == (
        f"gate output_collision failed: run {recorder.claim('demo').run_id} of arm demo, shard "
        f"0/1 is being run by {requeued.describe()}: a second run would run "
        "its items again; let that run finish or cancel it (scancel); if it is dead (e.g. its "
        f"node failed), remove {path}, then rerun"
    )


def test_a_run_whose_claim_was_taken_and_released_since_has_lost_its_share(
    tmp_path: Path,
) -> None:
    """A network cut leaves the first run alive on its node; its requeue elsewhere runs
    every item and releases the claim. Back on the network, the first run must not
    record: its late infra_error would be the newest record of an item already done."""
    path = tmp_path / "share.claim"
    job = SlurmJob(job_id="7", array_job_id="7", array_task_id="0", restart_count=0, node="n1")
    first = claim_share(path, Holder.current(job, "7_0.1"), share="s", file_mode=0o600)
    requeued = replace(Holder.current(replace(job, restart_count=1), "7_0r1.1"), host="n2")
    claim_share(path, requeued, share="s", file_mode=0o600).release()
    assert not path.exists()
    assert first.taken_by() == (
        "a later run of this share, which took this run's claim and has released it since"
    )


def test_a_continuation_takes_over_the_claim_of_the_attempt_it_runs_again(
    tmp_path: Path,
) -> None:
    """The attempt at the share on a node whose network was cut still holds its claim;
    Slurm ended its job, and `haico continue` submitted a new job for the share. The new
    job knows the attempts it supersedes (HAICO_SUPERSEDES) and takes the claim over."""
    path = write_claim(tmp_path / "c.json", host="node3", job="18_0", run_id="18_0r1.1")
    continuation = Holder.current(
        SlurmJob.from_environ(
            {"SLURM_JOB_ID": "22", "SLURM_ARRAY_JOB_ID": "21", "SLURM_ARRAY_TASK_ID": "0",
             "HAICO_SUPERSEDES": "17_1:18_0"}
        ),
        "21_0.1",
    )  # fmt: skip
    claim = claim_share(path, continuation, share=SHARE, file_mode=0o640)
    assert json.loads(path.read_text())["ended"] == ["17_1", "18_0"]
    claim.release()
    # A job it does not supersede, on another host, is still presumed alive.
    path = write_claim(tmp_path / "d.json", host="node3", job="18_1", run_id="18_1.1")
    with pytest.raises(ShareClaimedError):
        claim_share(path, continuation, share=SHARE, file_mode=0o640)


@pytest.mark.parametrize("value", ["18_0,18_1", "18_0::x", "../1", "18_0:"])
def test_superseded_attempts_that_are_not_jobs_are_refused(value: str) -> None:
    with pytest.raises(ConfigError, match="HAICO_SUPERSEDES"):
        SlurmJob.from_environ({"HAICO_SUPERSEDES": value})
