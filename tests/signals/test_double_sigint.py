"""A second SIGINT while pytest reports the first: the session still stops the campaign's
way (no traceback, the first INT's exit code)."""

from __future__ import annotations

from tests.harness import CampaignProject

# The item is Ctrl-C'd; as pytest reports that interrupt, Ctrl-C comes again.
SIGINT_MODULE = """
import os
import signal


def test_conversation(haico_item):
    os.kill(os.getpid(), signal.SIGINT)
    (lambda: None)()  # a Python call: the handler runs here
"""
SECOND_SIGINT = """
import os
import signal


def pytest_keyboard_interrupt(excinfo):
    os.kill(os.getpid(), signal.SIGINT)
    (lambda: None)()
"""


def test_a_second_sigint_while_the_first_is_reported_is_handled(
    campaign: CampaignProject,
) -> None:
    campaign.arm("demo")
    campaign.simple_scripts("a", "b")
    campaign.write("test_conversations.py", SIGINT_MODULE)
    campaign.write("conftest.py", SECOND_SIGINT)
    result = campaign.run_subprocess("--haico-exit", "campaign")
    assert result.ret == 75, result.stdout.str()
    output = result.stdout.str() + result.stderr.str()
    assert "Traceback" not in output
    assert "haico: SIGINT again: stopping now" in output
    assert [r["verdict"] for r in campaign.records("demo")] == ["interrupted"]
