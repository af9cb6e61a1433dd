"""The multi-node test cluster itself: nodes with their own names, addresses and TMPDIRs,
reachable from each other, and stopped without a trace."""

from __future__ import annotations

import subprocess
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.polling import wait_for
from tests.slurm.nodes import LOGIN, MultiNodeCluster, missing_namespace_requirements


def _job(cluster: MultiNodeCluster, node: str, script: str, out: Path, *options: str) -> str:
    """A batch job pinned to `node`, submitted from the login node; its id."""
    done = cluster.run_on(
        LOGIN, "sbatch", "--parsable", "-w", node, "-o", str(out), *options, "--wrap", script,
        check=True,
    )  # fmt: skip
    return done.stdout.strip()


def test_each_node_has_its_name_address_and_own_tmpdir_and_reaches_the_others(
    slurm_nodes: Callable[[int], MultiNodeCluster], tmp_path: Path
) -> None:
    cluster = slurm_nodes(3)
    nodes = cluster.compute
    assert nodes == ["node1", "node2", "node3"]
    listen = cluster.nodes["node1"]
    # node1 serves a file on its address; every node writes its TMPDIR and fetches it.
    (tmp_path / "www").mkdir()
    (tmp_path / "www" / "hello").write_text("from node1\n")
    server = _job(
        cluster,
        "node1",
        f"exec python3 -m http.server --bind {listen.address} 8000 -d {tmp_path / 'www'}",
        tmp_path / "server.out",
    )
    fetch = textwrap.dedent(
        """\
        hostname; echo "$TMPDIR"; touch "$TMPDIR/mark-$(hostname)"; ls "$TMPDIR"
        for i in $(seq 100); do
            python3 -c 'import urllib.request as u; print(u.urlopen("http://node1:8000/hello").read().decode(), end="")' 2>/dev/null && break
            sleep 0.1
        done
        """  # noqa: E501
    )
    jobs = {node: _job(cluster, node, fetch, tmp_path / f"{node}.out") for node in nodes}
    states = cluster.wait_ended(*jobs.values(), timeout=60)
    assert set(states.values()) == {"COMPLETED"}, states
    cluster.run("scancel", server, check=True)
    for node in nodes:
        lines = (tmp_path / f"{node}.out").read_text().splitlines()
        # The name, the TMPDIR, what is in it (the node's own mark, beside what earlier
        # jobs of the session left there), and node1's answer.
        assert lines[:2] == [node, str(cluster.tmpdir)] and lines[-1] == "from node1", lines
        marks = [name for name in lines[2:-1] if name.startswith("mark-")]
        assert marks == [f"mark-{node}"], lines
        local = cluster.nodes[node].local_tmp
        assert [p.name for p in local.iterdir() if p.name.startswith("mark-")] == marks
        (local / f"mark-{node}").unlink()
    assert not list(cluster.tmpdir.iterdir()), "the login node's TMPDIR is the machine's"
    # The login node is a host of its own too.
    assert cluster.run_on(LOGIN, "hostname", check=True).stdout.strip() == LOGIN


def test_a_rebooted_node_loses_its_tmpdir_and_processes_and_comes_back(
    tmp_path: Path,
) -> None:
    reason = missing_namespace_requirements()
    if reason is not None:
        pytest.skip(reason)
    cluster = MultiNodeCluster(tmp_path / "cluster", count=2)
    cluster.start()
    try:
        script = 'touch "$TMPDIR/kept-$SLURM_JOB_ID"; exec sleep 300'
        job = _job(cluster, "node2", script, tmp_path / "j.out")
        unrequeued = _job(cluster, "node2", script, tmp_path / "u.out", "--no-requeue")
        local = cluster.nodes["node2"].local_tmp
        try:
            wait_for(lambda: len(list(local.iterdir())) == 2, timeout=60, what="both jobs")
        except BaseException:
            print(cluster.run("squeue", "-h", "-o", "%i %T %r %N").stdout)
            print(cluster.run("sinfo", "-N").stdout, cluster.log_tail("slurmctld", 40))
            raise
        cluster.reboot("node2")
        assert not list(cluster.nodes["node2"].local_tmp.iterdir())
        left = sorted(_cmdline(pid).split()[0] for pid in cluster.processes_on("node2"))
        assert left == ["sleep", "slurmd"], left  # the anchor and the new slurmd
        # The controller found it gone meanwhile, and requeued the job (JobRequeue=1, the
        # default, for a node failure); one that may not requeue failed with the node.
        assert cluster.job_fields(job)["Restarts"] == "1"
        assert cluster.wait_ended(unrequeued, timeout=30) == {unrequeued: "NODE_FAIL"}
        cluster.run("scancel", job, check=True)
        cluster.wait_ended(job, timeout=60)
        cluster.wait_idle(timeout=60)  # node2 back in service (ReturnToService=2)
    finally:
        cluster.stop()
    assert not any(node.netns in _netns() for node in cluster.nodes.values())
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert cluster.bridge not in links


def _cmdline(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()


def _netns() -> str:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
