"""`haico report --html` on a hand-written campaign of two arms with timelines and model
samples: the summary first (failures first), the allocation, small multiples only where
there are enough points, factored provenance, every item linked to its transcript, and its
filters as a user works them in headless Chromium (over the DevTools pipe, `tests.devtools`)."""

from __future__ import annotations

import json
import os
import re
import shutil
from datetime import UTC, datetime, timedelta
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from pytest_haico.cli.main import main
from pytest_haico.ledger.model_metrics import COLUMNS, Sample, csv_line
from pytest_haico.report.html import SECTIONS
from pytest_haico.report.html_plots import MIN_POINTS
from tests.devtools import Browser
from tests.results.ledgers import record, write_ledger

TIMELINE = {
    "schema": 1,
    "job": {"id": "7", "gpus": 4, "started_at": 1000.0, "queued_at": None},
    "process_started_at": 1001.0,
    "phases": {
        "static_gates": {"start": 1000.0, "end": 1010.0},
        "stack": {"start": 1010.0, "end": 1020.0},
        "conversing": {"first_start": 1020.0, "last_end": 1090.0},
        "final_dump": {"start": 1090.0, "end": 1095.0},
    },
    "exit": {"at": 1100.0, "code": 0},
    "model": {
        "samples": 10,
        "idle_share": 0.25,
        "mean_running": 2.5,
        "max_waiting": 1.0,
        "bottleneck": "backend",
    },
}


def _samples(n: int) -> str:
    rows = [
        Sample(float(t), t % 4, t % 2, 0.1, 100.0 * t, 10.0 * t, 4, 10 - t, None, 1.0)
        for t in range(n)
    ]
    return ",".join(COLUMNS) + "\n" + b"".join(csv_line(s) for s in rows).decode()


@pytest.fixture
def campaign(tmp_path: Path) -> Path:
    campaign = tmp_path / "results" / "c"
    demo: list[dict[str, Any] | str] = [record(f"a{i}", duration_s=1.0 + i) for i in range(6)]
    demo.append(record("x", verdict="expectation_failed"))
    demo += [record(f"l{i}", stratum="long") for i in range(MIN_POINTS - 1)]
    write_ledger(campaign / "demo", "local-1.1", demo)
    other: list[dict[str, Any] | str] = [
        record(f"o{i}", arm="other", run_id="local-2.1") for i in range(4)
    ]
    other += [
        record(f"f{i}", arm="other", run_id="local-2.1", verdict="expectation_failed")
        for i in range(2)
    ]
    write_ledger(campaign / "other", "local-2.1", other)
    for arm, run, vllm in (("demo", "local-1.1", "0.13.0"), ("other", "local-2.1", "0.14.0")):
        run_dir = campaign / arm / "runs" / run
        run_dir.mkdir(parents=True)
        config = {"NODE": "gpu017", "VLLM_VERSION": vllm}
        (run_dir / "run-config.json").write_text(json.dumps({"values": config}))
    demo_run = campaign / "demo" / "runs" / "local-1.1"
    (demo_run / "timeline.json").write_text(json.dumps(TIMELINE))
    (demo_run / "model-metrics.csv").write_text(_samples(10))
    other_run = campaign / "other" / "runs" / "local-2.1"
    (other_run / "timeline.json").write_text('{"schema": 1, "phases": ')  # killed mid-write
    (other_run / "model-metrics.csv").write_text(_samples(MIN_POINTS - 1))
    return campaign


class Page(HTMLParser):
    """Per section: the cells of each table row, each figure's series and images."""

    def __init__(self) -> None:
        super().__init__()
        self.sections: list[str] = []
        self.rows: dict[str, list[list[str]]] = {}
        self.figures: dict[str, list[str]] = {}
        self.images: list[int] = []
        self.details: list[str] = []
        self.links: list[str] = []
        self.options: dict[str, list[str]] = {}
        self._select = ""
        self._text: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "section":
            self.sections.append(a["id"])
        section = self.sections[-1] if self.sections else ""
        if tag == "tr":
            self.rows.setdefault(section, []).append([])
        elif tag == "td":
            self._text = []
        elif tag == "figure":
            self.figures.setdefault(section, []).append(a["data-series"])
            self.images.append(0)
        elif tag == "img":
            self.images[-1] += 1
        elif tag == "details":
            self.details.append(a["id"])
        elif tag == "a" and a.get("href", "").startswith("#"):
            self.links.append(a["href"][1:])
        elif tag == "select":
            self._select = a["data-filter"]
            self.options[self._select] = []
        elif tag == "option":
            self.options[self._select].append(a["value"])

    def handle_data(self, data: str) -> None:
        if self._text is not None:
            self._text.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "td" and self._text is not None:
            self.rows[self.sections[-1]][-1].append("".join(self._text))
            self._text = None

    def first_cells(self, section: str) -> list[str]:
        return [row[0] for row in self.rows[section] if row]


def _render(campaign: Path, tmp_path: Path) -> tuple[str, Page]:
    pytest.importorskip("matplotlib", reason="the report extra is not installed")
    page = tmp_path / "r.html"
    assert main(["report", str(campaign), "--html", str(page)]) == 0
    text = page.read_text()
    parsed = Page()
    parsed.feed(text)
    return text, parsed


def test_the_page_is_titled_by_the_campaign_spans_the_width_and_opens_on_the_summary(
    campaign: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text, page = _render(campaign, tmp_path)
    assert "<title>c: haico report</title>" in text and "<h1>Campaign c</h1>" in text
    # An arm's page is titled by its campaign too (the records name it).
    assert main(["report", str(campaign / "demo"), "--html", str(tmp_path / "arm.html")]) == 0
    assert "<title>c: haico report</title>" in (tmp_path / "arm.html").read_text()
    # It says when it was made and by what, and names the results relative to where it ran.
    made = re.search(r"made (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) UTC by pytest-haico ", text)
    assert made is not None
    now = datetime.now(UTC).replace(tzinfo=None)
    assert abs(datetime.strptime(made[1], "%Y-%m-%d %H:%M:%S") - now) < timedelta(hours=1)
    monkeypatch.chdir(campaign.parent)
    assert main(["report", str(campaign), "--html", str(tmp_path / "here.html")]) == 0
    assert "haico report of <code>c</code>" in (tmp_path / "here.html").read_text()
    assert "max-width" not in text
    assert page.sections == list(SECTIONS)
    # Pass rate per arm × stratum, lowest first: other 4/6, demo default 6/7, demo long 4/4.
    assert page.first_cells("summary") == ["other", "demo", "demo"]
    assert "66.7% [30.0, 90.3] (4/6)" in text and "85.7% [48.7, 97.4] (6/7)" in text


def test_the_allocation_comes_from_each_runs_timeline_and_a_damaged_one_is_named(
    campaign: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text, page = _render(campaign, tmp_path)
    # Other's timeline is torn: not counted, in its arm's row or the campaign's.
    assert page.first_cells("allocation") == ["demo", "campaign"]
    figures = ["1", "1.7 m", "0.11", "20%", "70%", "0%", "5%", "25%", "2.5", "backend"]
    assert page.rows["allocation"][1:] == [["demo", *figures], ["campaign", *figures]]
    damaged = campaign / "other" / "runs" / "local-2.1" / "timeline.json"
    assert f"{damaged}: unreadable (" in text
    out = capsys.readouterr().out
    assert (
        "where the allocation went, demo (1 run(s) with a timeline): allocation 1 min 40 s "
        "(0.11 GPU-h): starting 20%, conversing 70%, draining 0%, dumping 5%; model idle 25% "
        "of conversing time with items remaining, 2.5 requests running on average; "
        "bottleneck: backend"
    ) in out
    assert f"{damaged}: unreadable (" in out


def test_plots_are_small_multiples_of_one_series_drawn_only_with_enough_points(
    campaign: Path, tmp_path: Path
) -> None:
    text, page = _render(campaign, tmp_path)
    assert page.figures["distributions"] == ["demo × default", "other × default"]
    assert page.figures["cost-trend"] == ["demo × default", "other × default"]
    assert page.figures["model-load"] == ["demo local-1.1 running", "demo local-1.1 waiting"]
    assert set(page.images) == {1}  # one image per panel, no legend anywhere
    assert f"Not plotted, fewer than {MIN_POINTS} measured items: demo × long (4)." in text
    assert f"fewer than {MIN_POINTS} samples (one a second): other local-2.1 (4)." in text


def test_provenance_is_shared_once_then_what_differs_per_run(
    campaign: Path, tmp_path: Path
) -> None:
    text, _ = _render(campaign, tmp_path)
    assert text.count("NODE=gpu017") == 1
    assert text.count("VLLM_VERSION=0.13.0") == 1 and text.count("VLLM_VERSION=0.14.0") == 1


def test_every_item_links_to_its_transcript_with_filters_by_arm_stratum_and_verdict(
    campaign: Path, tmp_path: Path
) -> None:
    text, page = _render(campaign, tmp_path)
    assert page.details == [f"item-{i}" for i in range(17)]
    assert set(page.details) <= set(page.links)
    assert page.options == {
        "arm": ["", "demo", "other"],
        "stratum": ["", "default", "long"],
        "verdict": ["", "completed", "expectation_failed"],
    }
    # Failures first, each row and transcript carrying what the filters select on.
    assert page.first_cells("items")[:3] == ["x-r0", "f0-r0", "f1-r0"]
    assert '<details id="item-0" data-arm="demo" data-stratum="default" ' in text
    assert text.count("<b>user:</b> hi") == 17
    assert "http://" not in text and "https://" not in text


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# Each listed item's arm and verdict, and whether the page shows it.
ROWS = """[...document.querySelectorAll('table.items tr[data-verdict]')]
  .map(r => [r.dataset.arm, r.dataset.verdict, r.getClientRects().length > 0])"""


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (.ci/run installs it)")
def test_choosing_a_filter_in_chromium_hides_the_other_rows_and_all_brings_them_back(
    campaign: Path, tmp_path: Path
) -> None:
    assert CHROMIUM is not None
    page = tmp_path / "r.html"
    _render(campaign, tmp_path)
    env = {**os.environ, "HOME": str(tmp_path)}
    with Browser(CHROMIUM, tmp_path / "chromium", env=env) as browser:
        browser.open(page.as_uri())
        every = browser.evaluate(ROWS)
        assert len(every) == 6 + 1 + (MIN_POINTS - 1) + 6 and all(shown for *_, shown in every)

        browser.choose('select[data-filter="verdict"]', "expectation_failed")
        assert browser.evaluate('document.querySelector("[data-filter=verdict]").value') == (
            "expectation_failed"
        )
        rows = browser.evaluate(ROWS)
        assert sorted((arm, verdict) for arm, verdict, shown in rows if shown) == [
            ("demo", "expectation_failed"),
            ("other", "expectation_failed"),
            ("other", "expectation_failed"),
        ]
        browser.choose('select[data-filter="arm"]', "other")  # both filters hold
        rows = browser.evaluate(ROWS)
        assert [(arm, verdict) for arm, verdict, shown in rows if shown] == [
            ("other", "expectation_failed")
        ] * 2

        browser.choose('select[data-filter="verdict"]', "")
        browser.choose('select[data-filter="arm"]', "")
        assert browser.evaluate(ROWS) == every
