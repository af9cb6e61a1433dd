"""The chaos benchmark, small, run as `benchmarks/chaos.py` runs for anyone: a campaign under
random faults finished by `haico continue --until-done` alone. On the session's single-node
Slurm (one arm, 40 items of 2 turns over two tasks, a fault every 10-20 s, a few minutes),
and with `--nodes 3` on a three-node cluster of its own, node faults among the faults and one
arm on a model served on another node."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.slurm.cluster import SlurmCluster, missing_requirements
from tests.slurm.nodes import missing_namespace_requirements

REPO = Path(__file__).resolve().parents[2]
BOUND_MIN = 20  # the benchmark gives up after this; the subprocess's own timeout is later
# Seed 19's first four kinds: term, then each node fault (the kinds follow from the seed).
NODE_SEED = "19"


def _chaos(tmp_path: Path, *args: str) -> tuple[dict[str, Any], str, int]:
    """The benchmark's figures (--json), its output and its exit status."""
    figures = tmp_path / "chaos.json"
    chaos = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "chaos.py"), *args,
         "--bound", str(BOUND_MIN), "--keep", str(tmp_path / "project"), "--json", str(figures)],
        capture_output=True,
        text=True,
        timeout=BOUND_MIN * 60 + 300,
    )  # fmt: skip
    out = chaos.stdout + chaos.stderr
    assert figures.exists(), out
    return json.loads(figures.read_text()), out, chaos.returncode


def _assert_finished(summary: dict[str, Any], out: str, *, items: int) -> None:
    assert summary["faults"], "no fault was injected:\n" + out
    assert summary["items"] == items
    assert (summary["lost"], summary["duplicated"]) == (0, 0), out
    assert summary["terminal_once"] == items, out
    assert summary["bad_ends"] == [], out  # every task ended 0, 75, 78 or 4
    assert summary["ends"], out
    assert summary["services_left"] == [], out
    assert summary["loop_exit"] == 0, out
    assert summary["human_commands"] == 0, out
    assert summary["redone_share"] <= summary["max_redone"], out


def test_a_campaign_under_random_faults_finishes_unattended_with_every_item_once(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    summary, out, status = _chaos(
        tmp_path, "--cluster", str(slurm_cluster.base), "--arms", "1", "--items", "40",
        "--turns", "2", "--latency-ms", "1500", "--tasks", "2", "--every", "10-20",
        "--seed", "20",
    )  # fmt: skip
    _assert_finished(summary, out, items=40)
    assert status == 0, out


def test_a_campaign_over_three_nodes_under_node_faults_finishes_unattended(
    tmp_path: Path,
) -> None:
    """Two arms (chaos0 on its model served on a compute node, chaos1 starting its own) of
    40 items over two tasks each, a fault every 10-20 s: its first four kinds a TERM, a
    network cut, a killed slurmd and a reboot."""
    reason = missing_requirements() or missing_namespace_requirements()
    if reason is not None:
        pytest.skip(f"no multi-node Slurm here: {reason}")
    summary, out, status = _chaos(
        tmp_path, "--nodes", "3", "--arms", "2", "--items", "40", "--turns", "2",
        "--latency-ms", "1500", "--tasks", "2", "--every", "10-20", "--seed", NODE_SEED,
    )  # fmt: skip
    _assert_finished(summary, out, items=80)
    assert summary["nodes"] == 3 and summary["served_on"], out
    # Node faults landed, each node healed. Which kinds land depends on where the tasks run
    # when a fault is due (a reboot waits for a task on a node not faulted or spared);
    # tests/slurm/test_node_faults.py holds each kind on its own.
    assert {"net-cut", "slurmd-kill", "reboot"} & set(summary["faults"]), out
    assert summary["heals"] == {k: summary["faults"][k] for k in summary["heals"]}, out
    assert sum(summary["heals"].values()) == sum(
        n for k, n in summary["faults"].items() if k in ("net-cut", "slurmd-kill", "reboot")
    ), out
    # Never every node excluded: the served model's node, spared, never is.
    excluded = {node for nodes in summary["exclusions"].values() for node in nodes}
    assert summary["served_on"] not in excluded, out
    assert status == 0, out
