"""A bad node under a real multi-node Slurm: the tasks that land on a node whose disk is full
fail there while the same shares succeed elsewhere; `haico continue` reruns those indices
alone with the node excluded, says so, records it, and the campaign finishes."""

from __future__ import annotations

import re
from pathlib import Path

from tests.slurm.nodes import LOGIN, MultiNodeCluster
from tests.slurm.project import Project, make_project, terminal_once, work_items


def test_haico_continue_reruns_a_bad_nodes_tasks_elsewhere_excluding_it(
    broken_cluster: MultiNodeCluster, tmp_path: Path
) -> None:
    cluster = broken_cluster
    project: Project = make_project(tmp_path, cluster, host=LOGIN)
    work_items(project, count=36, turns=1, latency_ms=20)  # 2 to 11 in each of 6 shards
    smoke = project.haico("submit", "demo", "--stage", "smoke", "--limit", "1")
    assert smoke.returncode == 0, smoke.stdout + smoke.stderr
    assert set(cluster.wait_ended(*project.job_ids("smoke")).values()) == {"COMPLETED"}

    cluster.fill_disk("node3")
    # Six tasks on three nodes of two CPUs each: two land on every node, node3's fail there.
    full = project.haico("submit", "demo", "--stage", "full", "--tasks", "6", "--time", "10")
    assert full.returncode == 0, full.stdout + full.stderr
    [full_id] = project.job_ids("full")
    ends = cluster.wait_ended(full_id)
    hosts = {task: cluster.job_fields(task)["BatchHost"] for task in ends}
    bad = sorted(task for task, host in hosts.items() if host == "node3")
    assert len(bad) == 2, hosts
    assert {task: ends[task] for task in bad} == dict.fromkeys(bad, "FAILED"), ends
    assert {ends[task] for task in ends if task not in bad} == {"COMPLETED"}, ends

    dry = project.haico("continue", "demo", "--dry-run")
    assert dry.returncode == 0, dry.stdout + dry.stderr
    for task in bad:
        assert re.search(
            rf"task {task.split('_')[1]} \(job {task}\): FAILED 78:0, .*: rerun .*gate "
            r"node_tmpdir failed on node node3, and passed for this arm on node1, node2",
            dry.stdout,
        ), dry.stdout
    assert "haico: the reruns exclude node(s) node3" in dry.stdout
    assert "--exclude=node3" in dry.stdout
    assert not project.job_ids("continue-1")

    rerun = project.haico("continue", "demo")
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    [cont_id] = project.job_ids("continue-1")
    indices = ",".join(task.split("_")[1] for task in bad)
    assert f"shards {indices} of" in rerun.stdout, rerun.stdout  # those indices alone
    [plan] = [
        e["plan"]
        for e in project.journal()
        if e["state"] == "PREPARED" and ".continue-1." in e["job"]
    ]
    assert plan["exclude"] == ["node3"]  # the journal records the exclusion
    assert set(cluster.wait_ended(cont_id).values()) == {"COMPLETED"}
    terminal_once(project, 36)
    reran = {r["slurm"]["node"] for r in project.records() if r["slurm"]["array_job_id"] == cont_id}
    assert reran and reran <= {"node1", "node2"}, reran
    done = project.haico("continue", "demo")
    assert "haico: nothing to continue" in done.stdout, done.stdout


def test_haico_continue_stops_naming_the_nodes_rather_than_exclude_every_node(
    broken_cluster: MultiNodeCluster, tmp_path: Path
) -> None:
    """node3's disk fills first, while the full stage runs; then node1's and node2's fill
    too, and the reruns fail on each node twice. Excluding the last one would leave nothing
    to run on: the loop stops, naming the three nodes and how to run on them again."""
    cluster = broken_cluster
    project: Project = make_project(tmp_path, cluster, host=LOGIN)
    work_items(project, count=12, turns=1, latency_ms=20)
    smoke = project.haico("submit", "demo", "--stage", "smoke", "--limit", "1")
    assert smoke.returncode == 0, smoke.stdout + smoke.stderr
    assert set(cluster.wait_ended(*project.job_ids("smoke")).values()) == {"COMPLETED"}
    cluster.fill_disk("node3")
    full = project.haico("submit", "demo", "--stage", "full", "--tasks", "6", "--time", "10")
    assert full.returncode == 0, full.stdout + full.stderr
    cluster.wait_ended(*project.job_ids("full"))
    cluster.fill_disk("node1")
    cluster.fill_disk("node2")

    said = ""
    # What --until-done does, without its minutes between rounds: where each rerun lands
    # is Slurm's choice, but every node takes 2 failed attempts before it is excluded.
    for round_ in range(1, 10):
        done = project.haico("continue", "demo", "--max-rounds", "10")
        said += done.stdout
        if done.returncode != 0 or not project.job_ids(f"continue-{round_}"):
            break
        cluster.wait_ended(*project.job_ids(f"continue-{round_}"))
    assert done.returncode == 1, said + done.stderr
    assert "haico: the reruns exclude node(s) " in said, said
    assert re.search(
        r"terminal: .*but every node of the default partition is excluded: node1 \(2 attempts "
        r"failed there: .*\), node2 \(2 attempts failed there: .*\), node3 \(2 attempts failed "
        r"there: .*\); ask your site to look at them \(sinfo -R\), then `haico continue "
        r"--no-exclude` runs on them again",
        done.stdout,
    ), done.stdout
    excluded = [
        e["plan"]["exclude"]
        for e in project.journal()
        if e["state"] == "PREPARED" and ".continue-" in e["job"]
    ]
    assert excluded and all(nodes != ["node1", "node2", "node3"] for nodes in excluded), excluded
