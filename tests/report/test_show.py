"""`haico show` on a campaign the stand-ins really ran twice (a `--haico-no-resume` rerun):
one item's attempt, turn by turn, from its record and its transcript."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from pytest_haico.cli.main import main
from pytest_haico.cli.show import run_show
from tests.harness import CONVERSATION_MODULE, CampaignProject

# Each test runs a child process (the fast loop, `-m "not slow"`, leaves them out).
pytestmark = pytest.mark.subprocess

NOTES = {
    "id": "notes",
    "turns": [
        {"user": "Plan a meeting.", "expect": {"contains": "meeting"}},
        {"user": "Write it up as a document.", "expect": {"artifact": True}},
    ],
}
UNASKED = {"id": "unasked", "turns": [{"user": "Say hi.", "expect": {"artifact": True}}]}


@pytest.fixture
def ran(campaign: CampaignProject) -> Path:
    campaign.scripts("s.jsonl", "".join(json.dumps(s) + "\n" for s in (NOTES, UNASKED)))
    campaign.write("test_conversations.py", CONVERSATION_MODULE)
    campaign.arm("demo", '[run]\nconcurrency = 2\n[standin]\npersona = "helpful"\n')
    for extra in ((), ("--haico-no-resume",)):
        done = campaign.run_subprocess("--haico-exit", "campaign", "--haico-campaign", "s", *extra)
        assert done.ret in (0, 1), done.stdout.str()  # unasked fails its expectation
    return campaign.root / "results" / "s"


def test_show_prints_the_newest_attempt_turn_by_turn_and_pages_by_attempt(
    ran: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = sorted(p.stem for p in (ran / "demo" / "ledger").glob("*.jsonl"))
    assert len(runs) == 2
    nodeid = "experiments/test_conversations.py::test_conversation[demo-notes-r0]"
    assert main(["show", "demo-notes-r0", "--campaign", str(ran)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].startswith("demo notes-r0  item ")
    assert lines[0].endswith(
        "  test experiments/test_conversations.py::test_conversation[demo-notes-r0]"
    )
    assert lines[1].startswith(
        f"attempt 2 of 2 (--attempt N shows another): run {runs[1]}, started "
    )
    assert "turn 1 of 2" in lines and "turn 2 of 2" in lines
    first, second = out.split("turn 2 of 2")
    assert "  user: Plan a meeting." in first
    assert '  expect contains "meeting": pass' in first
    assert "  user: Write it up as a document." in second
    assert "    tool call write_document(" in second
    assert "  expect artifact true: pass" in second
    assert any(line.startswith("  answer: ") for line in second.splitlines())
    assert " step(s), 1 tool call(s), 0 tool error(s), tokens " in second
    assert lines[-1] == "verdict: completed"
    assert "\033[" not in out  # not a terminal: no colour

    # The first attempt, by its number; its full test id names it as well.
    assert main(["show", nodeid, "--attempt", "1", "--campaign", str(ran)]) == 0
    assert (
        capsys.readouterr()
        .out.splitlines()[1]
        .startswith(f"attempt 1 of 2 (--attempt N shows another): run {runs[0]}, ")
    )
    assert main(["show", nodeid, "--attempt", "3", "--campaign", str(ran)]) == 2
    assert capsys.readouterr().err == (
        "haico: --attempt 3: the item has 2 attempt(s): give 1 to 2\n"
    )


def test_a_failed_expectation_shows_what_was_seen_and_the_verdict(
    ran: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["show", "demo-unasked-r0", "--campaign", str(ran)]) == 0
    lines = capsys.readouterr().out.splitlines()
    (expect,) = [line for line in lines if line.startswith("  expect ")]
    assert expect.startswith("  expect artifact true: FAIL (seen: ")
    assert lines[-2:] == ["verdict: expectation_failed"] or lines[-2] == (
        "verdict: expectation_failed"
    )


def test_an_unknown_id_is_one_line_naming_the_close_matches(
    ran: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["show", "demo-note-r0", "--campaign", str(ran)]) == 2
    assert capsys.readouterr().err == (
        f"haico: no item 'demo-note-r0' in {ran}: close matches: demo-notes-r0, "
        "demo-unasked-r0 (give an item id or a test id, as `haico report` and the ledger "
        "name them)\n"
    )


def test_colour_only_on_a_terminal_and_never_with_no_color(
    ran: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    said: list[str] = []
    run_show(ran, "demo-notes-r0", attempt=None, colour=True, say=said.append)
    assert "\033[32mpass\033[0m" in "\n".join(said)

    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    monkeypatch.delenv("NO_COLOR", raising=False)
    assert main(["show", "demo-notes-r0", "--campaign", str(ran)]) == 0
    assert "\033[32mpass\033[0m" in capsys.readouterr().out
    monkeypatch.setenv("NO_COLOR", "1")
    assert main(["show", "demo-notes-r0", "--campaign", str(ran)]) == 0
    assert "\033[" not in capsys.readouterr().out
