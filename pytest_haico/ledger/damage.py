"""A damaged ledger record: a field that a reader cannot use, named with its value and why.
Every reader skips such a record (`format.iter_ledger` asks `damaged_field` of each)."""

from __future__ import annotations

import math
from typing import Any

# A record's optional counts and seconds: what the readers add, sort, plot or print.
_TURN_COUNTS = ("tokens_in", "tokens_out", "steps", "tool_calls", "tool_errors")
_TURN_SECONDS = ("latency_s", "first_event_s")
_INF = math.inf


def damaged_field(data: dict[str, Any]) -> str | None:
    """The first field of a record that a reader cannot use (`repeat` not an integer, a
    turn's `tokens_in` a string, `duration_s` negative or infinite, `turns` no list of
    objects), as "field (value): why"; None for a usable record. `iter_ledger` skips such
    a record, so every reader skips it.

    Every record read is asked: one inline test passes a record as the writer writes it
    (every count an integer, every seconds a float), and only a record that fails it is
    searched field by field for what to name (the search costs 40% more)."""
    try:  # a missing field, or a turn that is no object, is for the search to name
        repeat = data["repeat"]
        duration = data["duration_s"]
        turns = data["turns"]
        if (
            type(data["stratum"]) is str
            and type(data["script"]) is str
            and type(repeat) is int
            and repeat >= 0
            and type(duration) is float
            and 0 <= duration < _INF
            and type(turns) is list
        ):
            for turn in turns:
                tokens_in = turn["tokens_in"]
                tokens_out = turn["tokens_out"]
                steps = turn["steps"]
                calls = turn["tool_calls"]
                errors = turn["tool_errors"]
                latency = turn["latency_s"]
                first = turn["first_event_s"]
                if not (
                    type(tokens_in) is int
                    and tokens_in >= 0
                    and type(tokens_out) is int
                    and tokens_out >= 0
                    and type(steps) is int
                    and steps >= 0
                    and type(calls) is int
                    and calls >= 0
                    and type(errors) is int
                    and errors >= 0
                    and type(latency) is float
                    and 0 <= latency < _INF
                    and type(first) is float
                    and 0 <= first < _INF
                ):
                    break
            else:
                return None
    except (KeyError, TypeError):
        pass
    return _first_damage(data)


def _first_damage(data: dict[str, Any]) -> str | None:
    for name in ("stratum", "script"):
        value = data.get(name)
        if value is not None and type(value) is not str:
            return f"{name} ({value!r}): not a string"
    for name, seconds in (("repeat", False), ("duration_s", True)):
        if (why := _unusable(data.get(name), seconds)) is not None:
            return f"{name} ({data.get(name)!r}): {why}"
    turns = data.get("turns")
    if turns is None:
        return None
    if type(turns) is not list:
        return f"turns ({type(turns).__name__}): not a list"
    for number, turn in enumerate(turns, 1):
        if type(turn) is not dict:
            return f"turn {number}: not an object"
        for name in _TURN_COUNTS:  # inline tests first: a record has a few per turn
            value = turn.get(name)
            if value is not None and (type(value) is not int or value < 0):
                return f"turn {number} {name} ({value!r}): {_unusable(value, False)}"
        for name in _TURN_SECONDS:
            value = turn.get(name)
            if (
                value is not None
                and not (type(value) is float and 0 <= value < math.inf)
                and (why := _unusable(value, True)) is not None
            ):
                return f"turn {number} {name} ({value!r}): {why}"
    return None


def _unusable(value: object, seconds: bool) -> str | None:
    """Why an optional count (or seconds) value is unusable; None when it is usable."""
    if value is None:
        return None
    if not seconds:
        if type(value) is not int:
            return "not an integer"
        return "negative" if value < 0 else None
    if type(value) is not int and type(value) is not float:
        return "not a number"
    try:
        usable = 0 <= float(value) < math.inf  # False for NaN
    except OverflowError:  # an int beyond any float
        usable = False
    return None if usable else "not a finite number >= 0"
