"""Node faults under a real multi-node Slurm, mid-campaign: what Slurm does with the task,
what the runs left on the node do, and what `haico continue` decides after."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

from tests.polling import wait_for
from tests.slurm.nodes import LOGIN, MultiNodeCluster
from tests.slurm.project import TERMINAL, Project, make_project, smoke_then_full, work_items


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
    wait_for(
        lambda: cluster.job_fields(f"{full}_0").get("Restarts") == "1",
        timeout=120,
        what=f"Slurm to requeue {full}_0 off {node}",
    )
    assert cluster.wait_ended(full, timeout=300) == {f"{full}_0": "COMPLETED"}
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
