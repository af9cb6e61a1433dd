"""A campaign over several nodes of a real Slurm: submitted from a login node, its tasks on
three compute nodes at once writing one results tree, every item once, each record and run
naming its node, and `haico report` and `haico cost` reading them together, per node; each
job on one node whatever its batch script asks."""

from __future__ import annotations

import json
import re
import subprocess
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

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


@pytest.fixture
def project(tmp_path: Path, slurm_nodes: Callable[[int], MultiNodeCluster]) -> Project:
    return make_project(tmp_path, slurm_nodes(3), host=LOGIN)


def test_a_campaign_over_three_nodes_writes_one_tree_and_reports_it_per_node(
    project: Project,
) -> None:
    cluster = project.cluster
    assert isinstance(cluster, MultiNodeCluster)
    # A batch script asking for two nodes still gets one per task: a run lives on one node.
    script = project.root / "sbatch" / "campaign.sbatch"
    script.write_text(script.read_text().replace("#SBATCH --nodes=1", "#SBATCH --nodes=2"))
    smoke = project.haico("submit", "demo", "--stage", "smoke", "--stratum", "default")
    assert smoke.returncode == 0, smoke.stdout + smoke.stderr
    full = project.haico(
        "submit", "demo", "--stage", "full", "--stratum", "default", "--tasks", "3"
    )
    assert full.returncode == 0, full.stdout + full.stderr
    [smoke_id] = project.job_ids("smoke")
    [full_id] = project.job_ids("full")
    ends = cluster.wait_ended(smoke_id, full_id)
    assert set(ends.values()) == {"COMPLETED"}, ends

    records = project.records()
    terminal = Counter(r["item_id"] for r in records if r["verdict"] in TERMINAL)
    assert len(terminal) == 6 and set(terminal.values()) == {1}, "an item ran twice or never"
    # The full stage's three tasks ran at once, one on each node (the partition is LLN).
    full_nodes = {r["slurm"]["array_task_id"]: r["slurm"]["node"] for r in records
                  if r["slurm"]["array_job_id"] == full_id}  # fmt: skip
    assert sorted(set(full_nodes.values())) == ["node1", "node2", "node3"], full_nodes
    # Each run's directory says where it ran, as its records do.
    arm = project.campaign_dir / "demo"
    for run_id in {r["run_id"] for r in records}:
        config = json.loads((arm / "runs" / run_id / "run-config.json").read_text())
        nodes = {r["slurm"]["node"] for r in records if r["run_id"] == run_id}
        assert nodes == {config["values"]["NODE"]}, (run_id, nodes, config["values"])
    # No service is left on any node: only the node's own slurmd (and its anchor).
    for name in cluster.compute:
        left = sorted(_command(pid) for pid in cluster.processes_on(name))
        assert left == ["sleep", "slurmd"], (name, left)

    for command in ("report", "cost"):
        shown = project.haico(command, "demo")
        assert shown.returncode == 0, shown.stdout + shown.stderr
        lines = shown.stdout.splitlines()
        [head] = [i for i, line in enumerate(lines) if line.startswith("per node")]
        assert lines[head].startswith("per node (3 nodes;"), command
        rows = {line.split()[0]: line.split() for line in lines[head + 2 : head + 5]}
        assert sorted(rows) == ["node1", "node2", "node3"], lines[head : head + 5]
        per_node = Counter(r["slurm"]["node"] for r in records)
        assert {node: int(row[1]) for node, row in rows.items()} == per_node


def test_two_until_done_loops_on_two_nodes_at_once_resubmit_an_owed_share_once(
    project: Project,
) -> None:
    cluster = project.cluster
    work_items(project, count=6, turns=3, latency_ms=3000)  # 9 s an item, one at a time
    full_id = smoke_then_full(project, tasks=2, time="10")
    log = project.campaign_dir / "submissions"
    logs = f"*/logs/full.*-{full_id}_0.out"
    wait_for(
        lambda: any(re.search(r"\d+ to run", p.read_text()) for p in log.glob(logs)),
        timeout=90,
        what="task 0 of the full stage to run its items",
    )
    # The task drains (USR1, as before a walltime) and exits 75: its share is owed.
    cluster.run("scancel", "--batch", "--signal=USR1", f"{full_id}_0", check=True)
    cluster.wait_ended(full_id)
    assert cluster.job_fields(f"{full_id}_0")["ExitCode"] == "75:0"

    loop = ["continue", "demo", "--until-done", "--every", "1", "--tasks", "1", "--time", "10"]
    loops = {}
    for host in ("node1", "node2"):
        argv, env = project.command(loop, host=host)
        loops[host] = subprocess.Popen(
            argv, cwd=project.root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True,
        )  # fmt: skip
    outs = {host: loops[host].communicate(timeout=600)[0] for host in loops}
    for host, out in outs.items():
        assert loops[host].returncode == 0, f"{host}:\n{out}"
        assert re.search(r"until-done: submission \S+ finished in \d+ round\(s\)\n\Z", out), out
    # Both decided under the one lock: the owed share was resubmitted once, by one of them.
    continuations = [
        e for e in project.journal() if e["state"] == "SUBMITTED" and ".continue-" in e["job"]
    ]
    assert len(continuations) == 1, continuations
    [cont_id] = [e["job_id"] for e in continuations]
    submitted = re.compile(rf"haico: \S+continue-1\S*: job {cont_id}, shards")
    assert sum(bool(submitted.search(out)) for out in outs.values()) == 1, outs
    terminal_once(project, 6)


def _command(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
