"""The campaign's one test: each item is a scripted conversation (arm x script x repeat)."""

from __future__ import annotations

from pytest_haico import Conversation, Verdict


def test_conversation(haico_conversation: Conversation) -> None:
    assert haico_conversation.verdict is Verdict.COMPLETED, haico_conversation.explain()
