"""`haico report --html` of a campaign the stand-ins really ran, rendered in headless
Chromium (Debian's `chromium`, which `.ci/run` installs): the screenshot is not blank and
the page has its sections, each failed item linked to its transcript."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

from pytest_haico.report.html import SECTIONS
from tests.harness import CONVERSATION_MODULE, CampaignProject

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
SCRIPTS = [
    {"id": "greet", "repeats": 3, "turns": [{"user": "Hello there."}]},
    {
        "id": "notes",
        "stratum": "long",
        "turns": [
            {"user": "Plan a meeting."},
            {"user": "Write it up as a document.", "expect": {"artifact": True}},
        ],
    },
    # Expects an artifact from a turn that asks for none: fails under persona helpful.
    {"id": "unasked", "repeats": 2, "turns": [{"user": "Say hi.", "expect": {"artifact": True}}]},
]


class Page(HTMLParser):
    """Ids, links and resource URLs of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: list[str] = []
        self.links: list[str] = []
        self.sources: list[str] = []
        self.tags: dict[str, int] = {}

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        self.tags[tag] = self.tags.get(tag, 0) + 1
        if values.get("id"):
            self.ids.append(str(values["id"]))
        if tag == "a" and values.get("href"):
            self.links.append(str(values["href"]))
        if values.get("src"):
            self.sources.append(str(values["src"]))


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (.ci/run installs it)")
def test_the_html_report_renders_its_sections_in_chromium(
    campaign: CampaignProject, tmp_path: Path
) -> None:
    pytest.importorskip("matplotlib", reason="the report extra is not installed")
    assert CHROMIUM is not None
    campaign.arm("demo", '[run]\nconcurrency = 4\n[standin]\npersona = "helpful"\n')
    campaign.scripts("s.jsonl", "".join(json.dumps(s) + "\n" for s in SCRIPTS))
    campaign.write("test_conversations.py", CONVERSATION_MODULE)
    run = campaign.run_subprocess("--haico-exit", "campaign")
    assert run.ret == 0, run.stdout.str()

    page = tmp_path / "report.html"
    report = subprocess.run(
        [sys.executable, "-m", "pytest_haico", "report", "results/default", "--html", str(page)],
        cwd=campaign.root,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert report.returncode == 0, report.stderr
    assert report.stdout.rstrip().endswith(f"HTML report: {page}")

    text = page.read_text()
    parsed = Page()
    parsed.feed(text)
    assert [i for i in parsed.ids if i in SECTIONS] == list(SECTIONS)
    # Two failed items, each linked from the summary to its section with the transcript.
    failed = [i for i in parsed.ids if i.startswith("item-")]
    assert failed == ["item-0", "item-1"]
    assert sorted(link for link in parsed.links if link.startswith("#item-")) == [
        "#item-0",
        "#item-1",
    ]
    assert text.count("<h4>turn 1</h4>") == 2 and "<b>user:</b> Say hi." in text
    assert "expectation_failed" in text
    # Self-contained: three plots inline, nothing fetched from anywhere.
    assert parsed.tags["img"] == 3
    assert all(src.startswith("data:image/png;base64,") for src in parsed.sources)
    assert "http://" not in text.replace("http://vllm.localhost", "")
    assert "https://" not in text

    shot = tmp_path / "report.png"
    chrome = subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            f"--user-data-dir={tmp_path / 'chromium'}",
            f"--screenshot={shot}",
            "--window-size=1200,2000",
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "HOME": str(tmp_path)},
    )
    assert shot.is_file(), chrome.stderr
    if os.environ.get("HAICO_SCREENSHOT"):
        shutil.copy(shot, os.environ["HAICO_SCREENSHOT"])
    from matplotlib import image

    pixels = image.imread(shot)[:, :, :3]
    assert pixels.shape[:2] == (2000, 1200)
    colours = {tuple(p) for p in (pixels[::4, ::4] * 255).astype(int).reshape(-1, 3)}
    ink = (pixels.min(axis=2) < 0.9).mean()
    assert len(colours) > 50, f"{len(colours)} colours: a blank page?"
    assert ink > 0.03, f"{ink:.1%} of the pixels not white: a blank page?"
