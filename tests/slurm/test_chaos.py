"""The chaos benchmark, small (one arm, 40 items of 2 turns over two tasks, a fault every
10-20 s, a few minutes), on the session's real Slurm: a campaign under random faults finished
by `haico continue --until-done` alone, run as `benchmarks/chaos.py` runs for anyone."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.slurm.cluster import SlurmCluster

REPO = Path(__file__).resolve().parents[2]
BOUND_MIN = 20  # the benchmark gives up after this; the subprocess's own timeout is later


def test_a_campaign_under_random_faults_finishes_unattended_with_every_item_once(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    figures = tmp_path / "chaos.json"
    chaos = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "chaos.py"),
            "--cluster",
            str(slurm_cluster.base),
            "--arms",
            "1",
            "--items",
            "40",
            "--turns",
            "2",
            "--latency-ms",
            "1500",
            "--tasks",
            "2",
            "--every",
            "10-20",
            "--seed",
            "20",
            "--bound",
            str(BOUND_MIN),
            "--keep",
            str(tmp_path / "project"),
            "--json",
            str(figures),
        ],
        capture_output=True,
        text=True,
        timeout=BOUND_MIN * 60 + 300,
    )
    out = chaos.stdout + chaos.stderr
    summary = json.loads(figures.read_text())
    assert summary["faults"], "no fault was injected:\n" + out
    assert summary["items"] == 40
    assert (summary["lost"], summary["duplicated"]) == (0, 0), out
    assert summary["terminal_once"] == 40, out
    assert summary["bad_ends"] == [], out  # every task ended 0, 75, 78 or 4
    assert summary["ends"], out
    assert summary["services_left"] == [], out
    assert summary["loop_exit"] == 0, out
    assert summary["human_commands"] == 0, out
    assert chaos.returncode == 0, out
