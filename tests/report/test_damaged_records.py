"""Damaged ledger records (the attack's shapes) are skipped with one warning line naming
file:line and the field; `haico report`, `report --html` and `compare` still run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pytest_haico.cli.main import main
from pytest_haico.results import load_results
from tests.results.ledgers import record, write_ledger


def _repeat_not_integer(data: dict[str, Any]) -> None:
    data["repeat"] = "r0"


def _tokens_in_string(data: dict[str, Any]) -> None:
    data["turns"][0]["tokens_in"] = "100"


def _duration_huge_negative(data: dict[str, Any]) -> None:
    data["duration_s"] = -1e308


def _duration_infinite(data: dict[str, Any]) -> None:
    data["duration_s"] = float("inf")


def _turns_not_list(data: dict[str, Any]) -> None:
    data["turns"] = {"index": 0}


DAMAGES = {
    "repeat": (_repeat_not_integer, "repeat ('r0'): not an integer"),
    "tokens_in": (_tokens_in_string, "turn 1 tokens_in ('100'): not an integer"),
    "duration_s": (_duration_huge_negative, "duration_s (-1e+308): not a finite number >= 0"),
    "duration_inf": (_duration_infinite, "duration_s (inf): not a finite number >= 0"),
    "turns": (_turns_not_list, "turns (dict): not a list"),
}


def _campaign(tmp_path: Path, damage: str) -> tuple[Path, Path]:
    damaged = record("c", duration_s=3.0)
    DAMAGES[damage][0](damaged)
    ledger = write_ledger(
        tmp_path / "camp" / "demo", "local-1.1", [record("a"), record("b"), damaged]
    )
    return tmp_path / "camp", ledger


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_the_reader_skips_a_damaged_record_naming_file_line_and_field(
    tmp_path: Path, damage: str
) -> None:
    campaign, ledger = _campaign(tmp_path, damage)
    results = load_results(campaign)
    assert len(results.records) == 2
    assert results.warnings == [f"{ledger}:3: skipped a damaged record: {DAMAGES[damage][1]}"]


@pytest.mark.parametrize("damage", sorted(DAMAGES))
@pytest.mark.parametrize("command", ["report", "report --html", "compare"])
def test_report_and_compare_survive_a_damaged_record(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], damage: str, command: str
) -> None:
    campaign, ledger = _campaign(tmp_path, damage)
    if command == "report":
        argv = ["report", str(campaign)]
    elif command == "report --html":
        pytest.importorskip("matplotlib")
        argv = ["report", str(campaign), "--html", str(tmp_path / "r.html")]
    else:
        argv = ["compare", str(campaign), str(campaign)]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "Traceback" not in captured.out + captured.err
    assert f"{ledger}:3: skipped a damaged record: {DAMAGES[damage][1]}" in captured.err
    if command == "report --html":
        assert (tmp_path / "r.html").stat().st_size > 0
