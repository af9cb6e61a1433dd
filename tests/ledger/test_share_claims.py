"""Two runs of the same arm and shard at once (a double sbatch): the second is refused
before anything starts, naming the first; a dead holder's claim is taken over."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pytest_haico.config.slurm import SlurmJob
from pytest_haico.errors import ResultsError, ShareClaimedError
from pytest_haico.ledger import claims
from pytest_haico.ledger.claims import (
    Holder,
    claim_share,
    process_start_time,
)
from tests.campaign.conftest import CampaignDir

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


def gated_campaign(campaign: CampaignDir) -> None:
    campaign.arm("demo")
    campaign.simple_scripts("a", "b", "c")
    (campaign.experiments / "test_conversations.py").write_text(GATED_TEST)


COMMAND = [sys.executable, "-m", "pytest", "experiments", "-p", "no:cacheprovider"]


def environ(job_id: str, gate: Path | None = None) -> dict[str, str]:
    env = {**os.environ, "SLURM_JOB_ID": job_id}
    env.pop("HAICO_TEST_GATE", None)
    if gate is not None:
        env["HAICO_TEST_GATE"] = str(gate)
    return env


def wait_for_first_item(gate: Path, process: subprocess.Popen[bytes], output: Path) -> None:
    started = gate.with_name(gate.name + ".started")
    deadline = time.monotonic() + 60
    while not started.exists():
        assert process.poll() is None, output.read_text()
        assert time.monotonic() < deadline, "the first run never started its first item"
        time.sleep(0.02)


def claim_path(campaign: CampaignDir) -> Path:
    return campaign.root / "results" / "default" / "demo" / "claims" / "shard-0of1.default.json"


def test_a_second_run_of_the_same_share_is_refused_naming_the_first(
    campaign: CampaignDir, tmp_path: Path
) -> None:
    gated_campaign(campaign)
    gate = tmp_path / "gate"
    output = tmp_path / "first.out"
    with open(output, "wb") as out:
        first = subprocess.Popen(
            COMMAND,
            cwd=campaign.root,
            env=environ("1001", gate),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for_first_item(gate, first, output)
        second = subprocess.run(
            COMMAND,
            cwd=campaign.root,
            env=environ("1002"),
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        gate.touch()
        first.wait(timeout=120)
    assert first.returncode == 0, output.read_text()

    assert second.returncode == pytest.ExitCode.USAGE_ERROR, second.stdout + second.stderr
    pytest.LineMatcher(second.stderr.splitlines()).fnmatch_lines(
        [
            f"ERROR: haico: {SHARE} is being run by run 1001.1 (host {HOST}, pid {first.pid}, "
            "Slurm job 1001, since 20*Z); a second run would run its items again. Let that run "
            "finish or cancel it; if it is dead (e.g. its node failed), remove "
            f"{claim_path(campaign)}, then rerun",
        ]
    )
    assert [r["run_id"] for r in campaign.records("demo")] == ["1001.1"] * 3
    runs = campaign.root / "results" / "default" / "demo" / "runs"
    assert sorted(p.name for p in runs.iterdir()) == ["1001.1"], "the refused run left a run"
    assert not claim_path(campaign).exists(), "the first run kept its claim after it ended"


def test_the_claim_of_a_run_killed_with_kill_9_is_taken_over(
    campaign: CampaignDir, tmp_path: Path
) -> None:
    gated_campaign(campaign)
    output = tmp_path / "first.out"
    gate = tmp_path / "never"
    with open(output, "wb") as out:
        first = subprocess.Popen(
            COMMAND,
            cwd=campaign.root,
            env=environ("2001", gate),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for_first_item(gate, first, output)
    finally:
        os.kill(first.pid, signal.SIGKILL)
        first.wait(timeout=30)
    assert json.loads(claim_path(campaign).read_text())["pid"] == first.pid

    second = subprocess.run(
        COMMAND, cwd=campaign.root, env=environ("2002"), capture_output=True, text=True, timeout=120
    )
    assert second.returncode == 0, second.stdout + second.stderr
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


def test_process_start_time_tells_a_live_process_from_a_dead_one() -> None:
    assert process_start_time(os.getpid()) is not None
    child = subprocess.Popen(["true"])
    child.wait()
    assert process_start_time(child.pid) is None


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
