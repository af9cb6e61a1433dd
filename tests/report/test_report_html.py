"""`haico report --html` of a campaign the stand-ins really ran, rendered in headless
Chromium (Debian's `chromium`, which `.ci/run` installs): the screenshot is not blank and
the page has its sections, every item linked to its transcript (the inline script opens the
one an address names), plots as small multiples of one series, and its first screen spans
the width of a wide window. `HAICO_SCREENSHOT=FILE` keeps the screenshot (the documentation's
is docs/images/report-html-first-screen.png)."""

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

# Each test runs a child process (the fast loop, `-m "not slow"`, leaves them out).
pytestmark = pytest.mark.subprocess

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# A wide window's first screen: the page must use its width (the old one stopped at 1100 px).
WIDTH, HEIGHT = 1600, 900
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
    """Ids, links, resource URLs and, per section, the series of each plot panel."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: list[str] = []
        self.links: list[str] = []
        self.sources: list[str] = []
        self.tags: dict[str, int] = {}
        self.panels: dict[str, list[str]] = {}
        self._section = ""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        self.tags[tag] = self.tags.get(tag, 0) + 1
        if values.get("id"):
            self.ids.append(str(values["id"]))
        if tag == "section":
            self._section = str(values["id"])
        if tag == "figure":
            self.panels.setdefault(self._section, []).append(str(values["data-series"]))
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
    # Every item links to its transcript; the two failed ones come first.
    items = [i for i in parsed.ids if i.startswith("item-")]
    assert items == [f"item-{i}" for i in range(6)]
    assert {link[1:] for link in parsed.links if link.startswith("#item-")} == set(items)
    assert text.count('data-verdict="expectation_failed"><summary>') == 2
    assert '<details id="item-1" data-arm="demo" data-stratum="default" ' in text
    assert text.count("<h4>turn 1</h4>") == 6 and "<b>user:</b> Say hi." in text
    # Small multiples: one image per panel, a panel for the one stratum with enough items.
    assert parsed.panels["distributions"] == ["demo × default"]
    assert parsed.tags["img"] == sum(len(p) for p in parsed.panels.values())
    # Self-contained: plots inline, nothing fetched from anywhere.
    assert all(src.startswith("data:image/png;base64,") for src in parsed.sources)
    assert "http://" not in text.replace("http://vllm.localhost", "")
    assert "https://" not in text

    def chromium(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                str(CHROMIUM),
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--hide-scrollbars",
                f"--user-data-dir={tmp_path / 'chromium'}",
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "HOME": str(tmp_path)},
        )

    # The inline script runs: the transcript an address names is opened.
    dom = chromium("--dump-dom", page.as_uri() + "#item-1").stdout
    assert '<details id="item-1" data-arm="demo" data-stratum="default" ' in dom
    assert dom.split('<details id="item-1"')[1].split(">")[0].endswith(' open=""')

    # The first screen of a wide window: the summary, spanning the width.
    shot = tmp_path / "report.png"
    chrome = chromium(f"--screenshot={shot}", f"--window-size={WIDTH},{HEIGHT}", page.as_uri())
    assert shot.is_file(), chrome.stderr
    if os.environ.get("HAICO_SCREENSHOT"):
        shutil.copy(shot, os.environ["HAICO_SCREENSHOT"])
    from matplotlib import image

    pixels = image.imread(shot)[:, :, :3]
    assert pixels.shape[:2] == (HEIGHT, WIDTH)
    colours = {tuple(p) for p in (pixels[::4, ::4] * 255).astype(int).reshape(-1, 3)}
    ink = (pixels.min(axis=2) < 0.9).mean()
    assert len(colours) > 50, f"{len(colours)} colours: a blank page?"
    assert ink > 0.03, f"{ink:.1%} of the pixels not white: a blank page?"
    inked = (pixels.min(axis=2) < 0.9).any(axis=0).nonzero()[0]
    assert inked[-1] > 0.95 * WIDTH, f"content ends at x={inked[-1]} of {WIDTH}"
