"""The campaign's one test: each item is a scripted conversation (arm x script x repeat)."""

from __future__ import annotations

from pytest_haico.items import ItemSpec


def test_conversation(haico_item: ItemSpec) -> None:
    assert haico_item.script.turns
