"""`haico compare` lists the expectations that passed on one side only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pytest_haico.report.compare import Pair, expectation_lines
from pytest_haico.results import Record


def _record(turns: Any) -> Record:
    return Record({"item_id": "i", "run_id": "r", "turns": turns}, Path("l.jsonl"), 1, Path("a"))


def _turn(index: Any, *checks: tuple[str, Any, bool, str]) -> dict[str, Any]:
    return {
        "index": index,
        "expectations": [
            {"expectation": key, "expected": value, "passed": passed, "seen": seen}
            for key, value, passed, seen in checks
        ],
    }


def test_expectation_changes_name_the_item_turn_expectation_and_what_b_saw() -> None:
    artifact_ok = ("artifact", True, True, "an artifact in step 1")
    contains = ("contains", "Crete", False, "no 'Crete' in the answer")
    a = _record([_turn(0, ("contains", "Crete", True, "")), _turn(1, artifact_ok)])
    b = _record([_turn(0, contains), _turn(1, ("artifact", True, False, "no artifact in 3 steps"))])
    same = _record([_turn(0, ("contains", "x", True, ""))])
    pairs = [Pair(("demo", "plan", 0), a, b), Pair(("demo", "greet", 0), same, same)]
    assert expectation_lines(pairs) == [
        "expectation changes: 2 passed in A and fail in B, 0 failed in A and pass in B",
        "  demo plan-r0 turn 1: expect contains \"Crete\": A pass → B FAIL (seen: no 'Crete' in "
        "the answer)",
        "  demo plan-r0 turn 2: expect artifact true: A pass → B FAIL (seen: no artifact in 3 "
        "steps)",
    ]
    assert expectation_lines([Pair(("", "plan", 1), b, a)])[1:] == [
        '  plan-r1 turn 1: expect contains "Crete": A fail → B pass',
        "  plan-r1 turn 2: expect artifact true: A fail → B pass",
    ]


def test_damaged_turns_give_no_expectation_change() -> None:
    damaged = [
        _record("not a list"),
        _record([_turn("0", ("contains", "x", False, ""))]),
        _record([{"index": 0, "expectations": "no"}, "not a turn"]),
    ]
    whole = _record([_turn(0, ("contains", "x", True, ""))])
    for record in damaged:
        assert expectation_lines([Pair(("", "s", 0), whole, record)]) == [
            "expectation changes: 0 passed in A and fail in B, 0 failed in A and pass in B"
        ]
