"""Strings matching a regular expression (a JSON schema's ``pattern``), built from its parse."""

from __future__ import annotations

import importlib
import re
import string
from collections.abc import Callable, Iterator
from typing import Any

# The stdlib's own regex parser; private but stable, and the only exact reading of a pattern.
_parser: Any = importlib.import_module("re._parser")

# Characters tried, in order, for a class such as [a-z] or \w.
_CANDIDATE_CHARS = string.ascii_lowercase + string.digits + string.ascii_uppercase + " _-.@:/"
_CATEGORY_TESTS: dict[str, Callable[[str], bool]] = {
    "CATEGORY_DIGIT": str.isdigit,
    "CATEGORY_NOT_DIGIT": lambda c: not c.isdigit(),
    "CATEGORY_SPACE": str.isspace,
    "CATEGORY_NOT_SPACE": lambda c: not c.isspace(),
    "CATEGORY_WORD": lambda c: c.isalnum() or c == "_",
    "CATEGORY_NOT_WORD": lambda c: not (c.isalnum() or c == "_"),
}
# How many longer variants (every repeat one longer each time) to offer after the shortest.
_VARIANTS = 24


def iter_matching_strings(pattern: str) -> Iterator[str]:
    """Candidate strings for *pattern*, shortest first; each is checked with ``re.search``.

    Alternations take their first branch, repeats their minimum (then one more per variant),
    anchors and look-arounds emit nothing; a candidate that fails the check is skipped.
    """
    try:
        tree = _parser.parse(pattern)
        compiled = re.compile(pattern)
    except (re.error, RecursionError):
        return
    for extra in range(_VARIANTS):
        try:
            candidate = _Emitter(extra).emit(tree)
        except LookupError:
            return
        if compiled.search(candidate):
            yield candidate


def _name(op: Any) -> str:
    return str(getattr(op, "name", op))


class _Emitter:
    def __init__(self, extra: int) -> None:
        self._extra = extra
        self._groups: dict[int, str] = {}

    def emit(self, tree: Any) -> str:
        return "".join(self._item(op, av) for op, av in tree)

    def _item(self, op: Any, av: Any) -> str:
        name = _name(op)
        if name == "LITERAL":
            return chr(av)
        if name == "NOT_LITERAL":
            return self._char(lambda c: ord(c) != av)
        if name == "ANY":
            return "a"
        if name == "IN":
            return self._char(lambda c: _in_class(av, c))
        if name == "BRANCH":
            return self.emit(av[1][0])
        if name == "SUBPATTERN":
            group, _, _, sub = av
            text = self.emit(sub)
            if group is not None:
                self._groups[group] = text
            return text
        if name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
            low, high, sub = av
            count = min(low + self._extra, high) if high >= low else low
            return "".join(self.emit(sub) for _ in range(count))
        if name == "ATOMIC_GROUP":
            return self.emit(av)
        if name == "GROUPREF":
            return self._groups.get(av, "")
        # AT (anchors), ASSERT, ASSERT_NOT, and anything newer: nothing to emit.
        return ""

    @staticmethod
    def _char(accepts: Callable[[str], bool]) -> str:
        for char in _CANDIDATE_CHARS:
            if accepts(char):
                return char
        raise LookupError("no candidate character fits the class")


def _in_class(items: Any, char: str) -> bool:
    negate = False
    hit = False
    for op, av in items:
        name = _name(op)
        if name == "NEGATE":
            negate = True
        elif name == "LITERAL":
            hit = hit or ord(char) == av
        elif name == "RANGE":
            hit = hit or av[0] <= ord(char) <= av[1]
        elif name == "CATEGORY":
            test = _CATEGORY_TESTS.get(_name(av))
            hit = hit or bool(test and test(char))
    return hit != negate
