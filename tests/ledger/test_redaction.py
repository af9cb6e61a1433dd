"""Every record passes a redaction filter before it is written: error messages the report
hook records (a test body's exception) never carry a credential into the ledger."""

from __future__ import annotations

from tests.harness import CampaignProject

RAISING_TEST = """
from pytest_haico import InfraError


def test_conversation(haico_item):
    raise InfraError(haico_item.script.turns[0].user)
"""


def run_raising(campaign: CampaignProject, message: str) -> str:
    campaign.arm("demo")
    campaign.scripts("a.yaml", f"id: a\nturns:\n  - user: '{message}'\n")
    (campaign.experiments / "test_conversations.py").write_text(RAISING_TEST)
    campaign.run().assert_outcomes(failed=1)
    (record,) = campaign.records("demo")
    assert record["error"]["kind"] == "InfraError"
    return str(record["error"]["message"])


def test_credentials_in_an_error_message_are_redacted(campaign: CampaignProject) -> None:
    message = run_raising(
        campaign,
        "connect to postgresql://haico:s3cr3t-pw@127.0.0.1:5432/db failed; "
        "sent Authorization: Bearer tok.en-42 and password=hunter2",
    )
    assert message == (
        "connect to postgresql://haico:[REDACTED]@127.0.0.1:5432/db failed; "
        "sent Authorization: Bearer [REDACTED] and password=[REDACTED]"
    )


def test_a_long_message_is_redacted_before_it_is_cut(campaign: CampaignProject) -> None:
    # The cut at 2000 characters falls inside the password: cut first, the rest of the
    # DSN no longer looks like one, and the password's start would be written.
    padding = "x" * (2000 - len("postgresql://u:") - 5)
    message = run_raising(campaign, f"{padding}postgresql://u:LONGSECRETVALUE@h/db")
    assert "LONGS" not in message
    assert message == f"{padding}postgresql://u:[REDACTED]@h/db"[:2000]
