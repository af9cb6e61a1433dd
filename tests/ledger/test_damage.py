"""Damaged records: the inline test that passes a record as written says what the
field-by-field search says, for every shape of every field it reads."""

from __future__ import annotations

import copy
import json
import math
from typing import Any

import pytest

from pytest_haico.ledger.damage import _first_damage, damaged_field
from pytest_haico.ledger.records import TurnRecord, record_line
from tests.campaign.test_ledger import make_record

_TURN = TurnRecord(
    index=0, latency_s=2.5, first_event_s=0.5, steps=3, tool_calls=1, tokens_in=10, tokens_out=5
)
_SHAPES: tuple[Any, ...] = (0, 1, -1, True, 1.0, -0.0, math.nan, math.inf, -1e308, None, "1", [])


class _Missing:
    """The field taken away; its repr names it in the test id (the same on every worker)."""

    def __repr__(self) -> str:
        return "missing"


_MISSING = _Missing()


def _written() -> dict[str, Any]:
    record = make_record().model_copy(update={"turns": (_TURN, _TURN)})
    data: dict[str, Any] = json.loads(record_line(record))
    return data


def _variants() -> list[tuple[str, dict[str, Any]]]:
    """The written record with one field it reads given each shape, or taken away."""
    variants = []
    for name in ("stratum", "script", "repeat", "duration_s", "turns"):
        for shape in (*_SHAPES, "x", {}, [1], _MISSING):
            data = _written()
            if shape is _MISSING:
                del data[name]
            else:
                data[name] = shape
            variants.append((f"{name}={shape!r}", data))
    turn_fields = ("tokens_in", "tokens_out", "steps", "tool_calls", "tool_errors")
    for name in (*turn_fields, "latency_s", "first_event_s"):
        for shape in (*_SHAPES, _MISSING):
            data = _written()
            if shape is _MISSING:
                del data["turns"][1][name]
            else:
                data["turns"][1][name] = shape
            variants.append((f"turn 2 {name}={shape!r}", data))
    for shape in ("x", 1, [], None):
        data = _written()
        data["turns"][0] = shape
        variants.append((f"turn 1={shape!r}", data))
    return variants


def test_a_record_as_written_is_sound() -> None:
    assert damaged_field(_written()) is None


@pytest.mark.parametrize(("shape", "data"), _variants(), ids=[v[0] for v in _variants()])
def test_the_inline_test_agrees_with_the_field_by_field_search(
    shape: str, data: dict[str, Any]
) -> None:
    assert damaged_field(copy.deepcopy(data)) == _first_damage(data)
