"""A campaign's job log against the real stand-ins: each conversation's line the moment it
ends, the arms' stacks healthy and stopped; a failed item's explanation once, in a few
lines; an infrastructure error without the fixture's source."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.harness import CONVERSATION_MODULE, CampaignProject

SCRIPTS = """
- id: chat
  turns:
    - user: "Hello, who are you?"
- id: doc
  turns:
    - user: "Plan a day in Porto."
    - user: "Write it up as a document."
      expect: {artifact: true}
"""

# Item a holds pytest's main thread until item b's line is in the job log: b's conversation
# runs beside a's, so its line can only come from the runner as it ends, never from pytest's
# report of b, which comes after a's.
WAITING_MODULE = """
import os
import time
from pathlib import Path

from pytest_haico import Verdict


def test_conversation(haico_conversation, haico_item):
    if haico_item.script.id == "a":
        log = Path(os.environ["HAICO_TEST_LOG"])
        deadline = time.monotonic() + 120
        while " demo b-r0 completed " not in log.read_text():
            assert time.monotonic() < deadline, "b's line did not come while a's test ran"
            time.sleep(0.05)
    assert haico_conversation.verdict is Verdict.COMPLETED, haico_conversation.explain()
"""


def test_a_conversations_line_comes_when_it_ends_not_when_pytest_reports_it(
    campaign: CampaignProject,
) -> None:
    campaign.arm("demo", "[run]\nconcurrency = 2\n")
    campaign.simple_scripts("a", "b")
    campaign.write("test_conversations.py", WAITING_MODULE)
    log = campaign.root / "background-0.out"
    run = campaign.start(env={"HAICO_TEST_LOG": str(log)})
    assert run.log == log
    assert run.wait(timeout=300) == 0, run.output()
    lines = run.output().splitlines()
    item_lines = [line for line in lines if line.startswith("[")]
    assert sorted(line.split(" ", 3)[2] for line in item_lines) == ["a-r0", "b-r0"], lines
    assert [line[:5] for line in item_lines] == ["[1/2]", "[2/2]"]
    healthy = [i for i, line in enumerate(lines) if line.startswith("haico: demo stack healthy")]
    stopped = [i for i, line in enumerate(lines) if line.startswith("haico: demo stack stopped")]
    assert len(healthy) == 1 and len(stopped) == 1, lines
    assert healthy[0] < lines.index(item_lines[0]) < lines.index(item_lines[1]) < stopped[0]


ARMS = {
    "looper": "[agent]\nrecursion_limit = 6\n[standin]\npersona = 'looper'\n",
    "hang": "[run]\nturn_timeout_s = 2\n[standin]\npersona = 'hang'\n",
}


@pytest.fixture(scope="module")
def _failing_runs() -> list[tuple[pytest.RunResult, Path]]:
    return []


@pytest.fixture
def failing_run(
    _failing_runs: list[tuple[pytest.RunResult, Path]],
    campaign: CampaignProject,
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[pytest.RunResult, Path]:
    """One run of a looping arm and a hanging one (in the first test's project), and where
    pytest ran."""
    if not _failing_runs:
        monkeypatch.setenv("COLUMNS", "200")  # the short summary's lines in full
        campaign.write("test_conversations.py", CONVERSATION_MODULE)
        campaign.scripts("cases.yaml", SCRIPTS)
        for name, text in ARMS.items():
            campaign.arm(name, text)
        result = campaign.run_subprocess(timeout=600)
        _failing_runs.append((result, campaign.root))
    (run,) = _failing_runs
    return run


def test_the_job_log_of_two_arms(failing_run: tuple[pytest.RunResult, Path]) -> None:
    result, _ = failing_run
    result.stdout.fnmatch_lines(
        [
            "haico: 0 done in ledger, 4 to run (0 retries)",
            "haico: hang stack healthy in *.* s (*, backend *.* s)",
            "[[]1/4[]] hang chat-r0 completed *.* s · ? in flight · ETA *",
            "[[]2/4[]] hang doc-r0 infra_error *.* s · 0 in flight · ETA *",
            "haico: hang stack stopped after * up, 2 item(s) recorded",
            "haico: looper stack healthy in *",
            "[[]3/4[]] looper ?*-r0 recursion_limit *.* s · ? in flight · ETA *",
            "[[]4/4[]] looper ?*-r0 recursion_limit *.* s · 0 in flight · ETA 0.0 s",
            "haico: looper stack stopped after * up, 2 item(s) recorded",
        ],
        consecutive=True,
    )


def test_a_failed_items_explanation_appears_once_in_a_few_lines(
    failing_run: tuple[pytest.RunResult, Path],
) -> None:
    result, root = failing_run
    text = result.stdout.str()
    for script, turns in (("chat", 1), ("doc", 2)):
        headline = f"looper-{script}-r0: recursion_limit after {turns} turn(s)"
        assert text.count(headline) == 1, text
        block = _failure_block(result.stdout.lines, f"looper-{script}-r0")
        assert block[0].startswith(headline), block
        assert 2 <= len(block) <= 4, block
        transcript = block[-1].removeprefix("transcript: ")
        assert transcript != block[-1] and (root / transcript).is_file(), block
    assert "haico_conversation = Conversation(" not in text
    # The short summary's word carries the verdict, and its message is not the explanation
    # again.
    result.stdout.fnmatch_lines(
        [
            "FAILED recursion_limit experiments/test_conversations.py::"
            "test_conversation[[]looper-chat-r0[]] - after 1 turn(s)",
            "ERROR infra_error experiments/test_conversations.py::"
            "test_conversation[[]hang-doc-r0[]] - after 2 turn(s)",
        ]
    )
    assert "recursion_limit after 1 turn(s) (recursion_limit:" not in text


def test_an_infra_error_shows_no_fixture_source(failing_run: tuple[pytest.RunResult, Path]) -> None:
    result, _ = failing_run
    text = result.stdout.str()
    block = _failure_block(result.stdout.lines, "hang-doc-r0")
    assert block[0].startswith("InfraError: hang-doc-r0: infra_error after 2 turn(s)"), block
    assert block[-1].startswith("transcript: results/default/hang/transcripts/"), block
    assert len(block) <= 4, block
    assert text.count("hang-doc-r0: infra_error after") == 1, text
    for source in ("def haico_conversation", "raise InfraError", "fixtures.py:"):
        assert source not in text, source


def _failure_block(lines: list[str], test_id: str) -> list[str]:
    """The lines of the item's section under FAILURES or ERRORS, header excluded."""
    name = re.escape(f"test_conversation[{test_id}]")
    header = re.compile(rf"^_+ (ERROR at setup of )?{name} _+$")
    start = next(i for i, line in enumerate(lines) if header.match(line)) + 1
    end = next(i for i in range(start, len(lines)) if lines[i].startswith(("_", "=")))
    return lines[start:end]
