"""`haico report` and `haico cost` side by side per node, when the records name several."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pytest_haico.cli.main import main
from tests.results.ledgers import record, write_ledger


def _on(node: str, data: dict[str, Any]) -> dict[str, Any]:
    data["slurm"] = {"job_id": "7", "array_job_id": "7", "array_task_id": "0", "node": node}
    return data


LATER = "2026-11-01T11:00:00+00:00"


@pytest.fixture
def campaign_dir(tmp_path: Path) -> Path:
    campaign = tmp_path / "results" / "c"
    write_ledger(
        campaign / "demo",
        "slurm-7_0.1",
        [
            _on("node1", record("a", duration_s=2.0)),
            _on("node1", record("b", duration_s=4.0)),
            _on("node3", record("c", verdict="infra_error")),
            _on("node3", record("d", verdict="infra_error")),
            _on("node2", record("c", attempt=2, duration_s=8.0, finished_at=LATER)),
            _on("node2", record("d", attempt=2, duration_s=6.0, finished_at=LATER)),
        ],
    )
    return campaign


def _section(out: str) -> list[str]:
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("per node"))
    return lines[start : start + 5]


@pytest.mark.parametrize("command", ["report", "cost"])
def test_failures_and_item_times_are_shown_per_node(
    command: str, campaign_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([command, str(campaign_dir)]) == 0
    head, *rows = _section(capsys.readouterr().out)
    assert head.startswith("per node (3 nodes;")
    assert [row.split() for row in rows[:4]] == [
        ["node", "records", "infra_error", "gave_up", "interrupted", "median", "p95"],
        ["node1", "2", "0", "0", "0", "3.00", "s", "4.00", "s"],
        ["node2", "2", "0", "0", "0", "7.00", "s", "8.00", "s"],
        ["node3", "2", "2", "0", "0", "-", "-"],
    ]


def test_one_node_has_no_section(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    campaign = tmp_path / "results" / "c"
    write_ledger(campaign / "demo", "slurm-7_0.1", [_on("node1", record("a"))])
    assert main(["report", str(campaign)]) == 0
    assert "per node" not in capsys.readouterr().out
