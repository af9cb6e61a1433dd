"""`haico report`'s terminal table on a hand-written campaign, and its one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_haico.cli.main import main
from pytest_haico.report import html as report_html
from pytest_haico.results import MissingExtraError
from tests.results.ledgers import record, write_ledger


@pytest.fixture
def campaign_dir(tmp_path: Path) -> Path:
    campaign = tmp_path / "results" / "c"
    demo = campaign / "demo"
    write_ledger(
        demo,
        "local-1.1",
        [
            record("a", duration_s=2.0),
            record("b", duration_s=4.0, verdict="recursion_limit"),
            record("c", verdict="infra_error", finished_at="2026-11-01T10:00:01+00:00"),
            record("d", stratum="long", duration_s=30.0, schema=1, turns=3),
        ],
    )
    write_ledger(demo, "local-2.1", [record("c", run_id="local-2.1", attempt=3, verdict="gave_up")])
    run = demo / "runs" / "local-1.1"
    run.mkdir(parents=True)
    (run / "claim.json").write_text(json.dumps({"claimed_at": 1793527170.0}))  # 10:00:00 - 30 s
    (run / "run-config.json").write_text(
        json.dumps({"values": {"VLLM_VERSION": "0.13.0", "NODE": "gpu017"}})
    )
    return campaign


def test_the_terminal_report_shows_each_arm_and_stratum(
    campaign_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["report", str(campaign_dir)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"{campaign_dir}: 4 items, 5 records, 2 runs"
    head, default, long = out[2:5]
    assert head.split() == [
        "arm",
        "stratum",
        "items",
        "turns",
        "median",
        "p95",
        "tokens",
        "in",
        "tokens",
        "out",
        "retries",
        "reruns",
        "gave",
        "up",
        "pass",
        "rate",
        "[95%]",
        "verdicts",
    ]
    assert default.split() == [
        "demo",
        "default",
        "3",
        "6",
        "3.00",
        "s",
        "4.00",
        "s",
        "600",
        "90",
        "1",
        "0",
        "1",
        "33.3%",
        "[6.1,",
        "79.2]",
        "(1/3)",
        "1",
        "completed,",
        "1",
        "recursion_limit,",
        "1",
        "gave_up",
    ]
    assert long.split()[:6] == ["demo", "long", "1", "3", "30.0", "s"]
    assert (
        "stack start-up, demo: median 30.0 s, max 30.0 s over 1 run(s) (run directory "
        "claimed → first item)" in out
    )
    assert (
        "adaptations: the ledger records none; from each run's run-config (keys naming ADAPT): none"
    ) in out
    assert "  in every run-config: NODE=gpu017; VLLM_VERSION=0.13.0" in out
    assert "  demo local-1.1: 4 records, start-up 30.0 s" in out
    assert "  demo local-2.1: 1 records, start-up -; no run-config.json" in out


def test_html_without_matplotlib_says_what_to_install(
    campaign_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def missing() -> None:
        raise MissingExtraError(
            "haico report --html needs matplotlib, which is not installed: "
            "pip install 'pytest-haico[report]'"
        )

    monkeypatch.setattr(report_html, "check_plotting", missing)
    assert main(["report", str(campaign_dir), "--html", str(campaign_dir / "r.html")]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        "haico: haico report --html needs matplotlib, which is not installed: "
        "pip install 'pytest-haico[report]'\n"
    )


@pytest.mark.parametrize("where", ["missing", "empty"])
def test_a_bad_campaign_path_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str
) -> None:
    if where == "empty":
        (tmp_path / where / "demo" / "ledger").mkdir(parents=True)
    assert main(["report", str(tmp_path / where)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    if where == "empty":
        assert err.startswith(f"haico: no ledger record in {tmp_path / where} ")
    else:
        assert err.startswith(f"haico: {tmp_path / where} does not exist: give ")


def test_the_html_report_of_a_written_campaign_links_every_item_failures_first(
    campaign_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("matplotlib", reason="the report extra is not installed")
    page = campaign_dir / "r.html"
    assert main(["report", str(campaign_dir), "--html", str(page)]) == 0
    text = page.read_text()
    assert text.count('<details id="item-') == 4
    assert all(f'href="#item-{i}"' in text for i in range(4))
    # The two failures (recursion_limit b, gave_up c) come first.
    opening = '<details id="item-{}" data-arm="demo" data-stratum="default" data-verdict="{}">'
    assert opening.format(0, "recursion_limit") in text
    assert opening.format(1, "gave_up") in text


@pytest.mark.subprocess
def test_the_haico_process_prints_the_report_and_stops_quietly_for_a_closed_pipe(
    campaign_dir: Path,
) -> None:
    command = [sys.executable, "-m", "pytest_haico", "report", str(campaign_dir)]
    whole = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert whole.returncode == 0, whole.stderr
    # Printed whole, although the process ends without freeing what it read.
    assert whole.stdout.splitlines()[0] == f"{campaign_dir}: 4 items, 5 records, 2 runs"
    assert "runs (provenance from runs/<run_id>/run-config.json):" in whole.stdout

    # `haico report | head -0`: the reader is gone before the first line.
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        closed = subprocess.run(command, stdout=write_end, stderr=subprocess.PIPE, timeout=120)
    finally:
        os.close(write_end)
    assert closed.returncode == 1
    assert closed.stderr == b""  # no "Broken pipe", no traceback
