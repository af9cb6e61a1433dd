"""Which items pytest will not run because of their marks, known before any of them runs.

Conversations are queued ahead of the items, so the runner must know at planning time
what pytest's skipping plugin decides only at each item's setup. This reads the marks
as that plugin does (`skip`, `skipif`, `xfail(run=False)`, string conditions evaluated
in the same namespace); a condition that cannot be evaluated errors the item, which then
does not run either.
"""

from __future__ import annotations

import os
import platform
import sys
from typing import Any

import pytest


def is_skipped_by_marks(item: pytest.Item) -> bool:
    """Whether pytest will skip the item (or not run its xfail) before its fixtures run."""
    config = item.config
    if not config.pluginmanager.has_plugin("skipping"):
        return False  # -p no:skipping: marks are not acted on
    try:
        if any(True for _ in item.iter_markers(name="skip")):
            return True
        if any(_applies(item, mark) for mark in item.iter_markers(name="skipif")):
            return True
        if config.getoption("runxfail", False):
            return False
        for mark in item.iter_markers(name="xfail"):
            if _applies(item, mark):
                # The first xfail that applies decides, as in pytest.
                return not mark.kwargs.get("run", True)
    except Exception:
        return True  # pytest errors the item at setup, before its fixtures
    return False


def _applies(item: pytest.Item, mark: pytest.Mark) -> bool:
    """A mark applies with no condition, or when any of its conditions is true."""
    conditions = mark.args if "condition" not in mark.kwargs else (mark.kwargs["condition"],)
    if not conditions:
        return True
    return any(_holds(item, mark, condition) for condition in conditions)


def _holds(item: pytest.Item, mark: pytest.Mark, condition: object) -> bool:
    if not isinstance(condition, str):
        if "reason" not in mark.kwargs:
            # pytest errors such an item at setup, whatever the condition's value.
            raise ValueError(f"{mark.name}: a boolean condition needs reason=")
        return bool(condition)
    namespace: dict[str, Any] = {"os": os, "sys": sys, "platform": platform, "config": item.config}
    for extra in reversed(item.ihook.pytest_markeval_namespace(config=item.config)):
        namespace.update(extra)
    function = getattr(item, "obj", None)
    namespace.update(getattr(function, "__globals__", {}))
    code = compile(condition, f"<{mark.name} condition>", "eval")
    return bool(eval(code, namespace))
