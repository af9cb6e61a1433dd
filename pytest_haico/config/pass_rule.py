"""The arm's `[run] pass_rule` (and `haico compare --pass-rule`): how a script's repeats make
one verdict for the pass rates and the gates. Not part of the item identity."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

PASS_RULES = ("all", "any", "majority", "k_of_n:K/N")
_K_OF_N = re.compile(r"k_of_n:([1-9][0-9]*)/([1-9][0-9]*)")


@dataclass(frozen=True)
class PassRule:
    """How a script's repeats make one verdict: `all`, `any`, `majority`, or `k_of_n` (at
    least `k` of exactly `n` repeats pass)."""

    name: str
    k: int = 0
    n: int = 0

    def __str__(self) -> str:
        return f"k_of_n:{self.k}/{self.n}" if self.name == "k_of_n" else self.name

    def passes(self, verdicts: Sequence[bool]) -> bool | None:
        """The script's verdict from its repeats', None when the rule cannot apply (k_of_n
        with another number of repeats than n)."""
        passed = sum(verdicts)
        if self.name == "all":
            return passed == len(verdicts)
        if self.name == "any":
            return passed > 0
        if self.name == "majority":
            return 2 * passed > len(verdicts)
        return passed >= self.k if len(verdicts) == self.n else None


def parse_pass_rule(text: str) -> PassRule:
    """`all`, `any`, `majority` or `k_of_n:K/N` (1 ≤ K ≤ N); else a ValueError saying so."""
    if text in ("all", "any", "majority"):
        return PassRule(text)
    match = _K_OF_N.fullmatch(text)
    if match and int(match[1]) <= int(match[2]):
        return PassRule("k_of_n", int(match[1]), int(match[2]))
    raise ValueError(
        f"{text!r} is not a pass rule: give one of {', '.join(PASS_RULES)}, with 1 ≤ K ≤ N "
        "(e.g. k_of_n:3/5: at least 3 of the script's 5 repeats pass)"
    )
