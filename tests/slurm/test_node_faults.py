"""Node faults under a real multi-node Slurm, mid-campaign: what Slurm does with the task,
what the runs left on the node do, and what `haico continue` decides after."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
from collections import Counter
from pathlib import Path

import pytest

from pytest_haico.errors import CatalogueError
from pytest_haico.procfs import is_alive
from pytest_haico.serve.catalogue import read_entry
from tests.polling import wait_for
from tests.slurm.nodes import LOGIN, MultiNodeCluster
from tests.slurm.project import (
    TERMINAL,
    Project,
    make_project,
    smoke_then_full,
    terminal_once,
    work_items,
)


def _running_items(project: Project, job: str) -> str:
    """The node of task 0 of `job`, once it converses."""
    logs = project.campaign_dir / "submissions"
    wait_for(
        lambda: any(
            re.search(r"\[1/\d+\]", p.read_text()) for p in logs.glob(f"*/logs/full.*-{job}_0.out")
        ),
        timeout=120,
        what=f"task 0 of job {job} to finish its first item",
    )
    return project.cluster.job_fields(f"{job}_0")["BatchHost"]


@pytest.mark.parametrize("fault", ["slurmd killed", "network cut", "reboot"])
def test_a_task_whose_node_fails_is_requeued_and_every_item_is_recorded_once(
    broken_cluster: MultiNodeCluster, tmp_path: Path, fault: str
) -> None:
    """slurmd killed or the network cut: the node goes DOWN, its first run lives on; a
    reboot: the node's processes die and its TMPDIR is wiped. Either way Slurm requeues
    the task elsewhere."""
    cluster = broken_cluster
    project = make_project(tmp_path, cluster, host=LOGIN)
    work_items(project, count=8, turns=2, latency_ms=6000)  # 12 s an item, one at a time
    full = smoke_then_full(project, tasks=1, time="10")
    node = _running_items(project, full)
    if fault == "slurmd killed":
        cluster.kill_slurmd(node)
    elif fault == "network cut":
        cluster.cut_network(node)
    else:
        cluster.reboot(node)
    # The controller finds the node gone and requeues the task (JobRequeue=1) elsewhere,
    # while its first run, cut off from Slurm, lives on.
    _requeued_and_completed(cluster, full, node)
    if fault == "network cut":
        cluster.restore_network(node)
    records = project.records()
    terminal = Counter(r["item_id"] for r in records if r["verdict"] in TERMINAL)
    assert len(terminal) == 8, terminal
    # Both runs recorded items, each its own: the first stopped at its next record once the
    # requeued run had taken its share.
    assert set(terminal.values()) == {1}, "an item was recorded done twice"
    assert {r["slurm"]["node"] for r in records if r["slurm"]["array_job_id"] == full} == {
        node,
        cluster.job_fields(f"{full}_0")["BatchHost"],
    }
    [log] = project.campaign_dir.glob(f"submissions/*/logs/full.*-{full}_0.out")
    lived_on = "took this run's share while this run lived on (its job was requeued"
    assert (lived_on in log.read_text()) == (fault != "reboot")
    done = project.haico("continue", "demo")
    assert "haico: nothing to continue" in done.stdout, done.stdout


def _requeued_and_completed(cluster: MultiNodeCluster, job: str, node: str) -> None:
    """Until the controller has requeued task 0 of `job` off `node` (JobRequeue=1) and the
    requeued run ended it COMPLETED."""
    wait_for(
        lambda: cluster.job_fields(f"{job}_0").get("Restarts") == "1",
        timeout=120,
        what=f"Slurm to requeue {job}_0 off {node}",
    )
    assert cluster.wait_ended(job, timeout=300) == {f"{job}_0": "COMPLETED"}


def _campaign_pytest(cluster: MultiNodeCluster, job: str) -> int:
    """The pid of the job's campaign pytest (the batch script's child)."""
    for process in cluster.processes_of_job(job):
        pid, _, command = process.partition(": ")
        if " -m pytest " in f" {command} " and "--haico-exit" in command:
            return int(pid)
    raise AssertionError(f"no campaign pytest in job {job}: {cluster.processes_of_job(job)}")


def test_a_run_stuck_while_its_requeue_ran_every_item_records_nothing_when_it_wakes(
    broken_cluster: MultiNodeCluster, tmp_path: Path
) -> None:
    """Its node lost slurmd while the run was stuck mid-conversation (as in a read from a
    model across a cut network). The requeue elsewhere runs every item, ends and releases
    the share claim; then the first run wakes. The claim that is gone is not its own: it
    records nothing, so no item gets a second record (a late infra_error would be its
    newest and make a COMPLETED task owe it)."""
    cluster = broken_cluster
    project = make_project(tmp_path, cluster, host=LOGIN)
    work_items(project, count=4, turns=2, latency_ms=3000)  # 6 s an item, one at a time
    full = smoke_then_full(project, tasks=1, time="10")
    node = _running_items(project, full)
    stuck = _campaign_pytest(cluster, full)
    os.kill(stuck, signal.SIGSTOP)
    try:
        cluster.kill_slurmd(node)
        _requeued_and_completed(cluster, full, node)
    finally:
        os.kill(stuck, signal.SIGCONT)
    wait_for(lambda: not is_alive(stuck), timeout=120, what="the woken run to stop")
    records = project.records()
    # Every item once, and no record at all after the requeued run's last: the woken run
    # wrote none.
    terminal_once(project, 4)
    last = max(r["finished_at"] for r in records if r["slurm"]["restart_count"] == 1)
    assert [r["item_id"] for r in records if r["finished_at"] > last] == []
    [log] = project.campaign_dir.glob(f"submissions/*/logs/full.*-{full}_0.out")
    released = "a later run of this share, which took this run's claim and has released it since"
    assert released in log.read_text()
    done = project.haico("continue", "demo")
    assert "haico: nothing to continue" in done.stdout, done.stdout


def test_a_network_cut_while_a_task_converses_with_a_model_on_another_node(
    broken_cluster: MultiNodeCluster, tmp_path: Path
) -> None:
    """`haico serve` puts the arm's model on one node; the campaign's task converses with
    it from another, whose network is then cut mid-turn. The controller finds the node
    DOWN and requeues the task onto the third node, which finishes the share. Once the
    network is back, the first run records nothing more, and `haico continue` has nothing
    left to do."""
    cluster = broken_cluster
    project = make_project(tmp_path, cluster, host=LOGIN)
    work_items(project, count=6, turns=2, latency_ms=3000)  # 6 s an item, one at a time
    served = project.root / "served"  # the model's own arm, kept out of the campaign
    shutil.copytree(project.root / "experiments", served)
    arm = project.root / "experiments" / "arms" / "demo.toml"
    arm.write_text(arm.read_text().replace("[model]\n", '[model]\nserved = "demo"\n', 1))
    started = project.haico(
        "serve", "demo", "--profile", "local", "--time", "20", f"--experiments={served}"
    )
    assert started.returncode == 0, started.stdout + started.stderr
    catalogue = project.root / "catalogue"
    wait_for(lambda: _registered_host(catalogue) is not None, timeout=240, what="the model")
    model_node = _registered_host(catalogue)
    # New jobs keep off the model's node: the campaign's task and its requeue go elsewhere.
    cluster.run("scontrol", "update", f"nodename={model_node}", "state=drain", "reason=model")
    try:
        full = smoke_then_full(project, tasks=1, time="10")
        node = _running_items(project, full)
        assert node != model_node
        first_run = _campaign_pytest(cluster, full)
        cluster.cut_network(node)
        _requeued_and_completed(cluster, full, node)
        cluster.restore_network(node)
        wait_for(lambda: not is_alive(first_run), timeout=180, what="the first run to stop")
    finally:
        project.haico("serve", "stop", "demo")
        cluster.run("scontrol", "update", f"nodename={model_node}", "state=resume")
    records = project.records()
    terminal_once(project, 6)
    ran = {r["slurm"]["node"] for r in records if r["slurm"]["array_job_id"] == full}
    assert ran == {node, cluster.job_fields(f"{full}_0")["BatchHost"]}
    assert model_node not in ran
    last = max(r["finished_at"] for r in records if r["slurm"]["restart_count"] == 1)
    assert [r["item_id"] for r in records if r["finished_at"] > last] == []
    # The first run lived through the cut, its turn to the model hanging, and stopped at
    # its next record.
    [log] = project.campaign_dir.glob(f"submissions/*/logs/full.*-{full}_0.out")
    assert "took this run's share while this run lived on" in log.read_text()
    done = project.haico("continue", "demo")
    assert "haico: nothing to continue" in done.stdout, done.stdout


def _registered_host(catalogue: Path) -> str | None:
    with contextlib.suppress(CatalogueError, OSError, ValueError):
        return read_entry(catalogue, "demo").host
    return None
