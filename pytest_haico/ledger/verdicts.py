"""Verdicts: what an item attempt ended as, their precedence, their pytest outcome, and
which are terminal (resume) and which measure an item time; modules that test a ledger's
text against them use these members (a `StrEnum` member equals and hashes as its text)."""

from __future__ import annotations

import enum
from collections.abc import Iterable


class Outcome(enum.StrEnum):
    """The pytest outcome a verdict maps to (the ledger's ``outcome`` field)."""

    PASSED = "passed"
    FAILED = "failed"
    ERROR = "error"
    SKIPPED = "skipped"


class Verdict(enum.StrEnum):
    """What one item attempt ended as; members are listed in precedence order."""

    SUBSTITUTED = "substituted"
    INFRA_ERROR = "infra_error"
    RATE_LIMITED = "rate_limited"
    INTERRUPTED = "interrupted"
    RECURSION_LIMIT = "recursion_limit"
    BLANK_TURN = "blank_turn"
    EXPECTATION_FAILED = "expectation_failed"
    COMPLETED = "completed"
    GAVE_UP = "gave_up"

    @property
    def outcome(self) -> Outcome:
        if self is Verdict.COMPLETED:
            return Outcome.PASSED
        if self in _ERROR_VERDICTS:
            return Outcome.ERROR
        return Outcome.FAILED

    @property
    def is_terminal(self) -> bool:
        """A terminal verdict means the item is done: resume does not run it again."""
        return self not in _RETRIED_VERDICTS

    @property
    def counts_as_attempt(self) -> bool:
        """Infra failures use up an attempt; an interrupted attempt does not."""
        return self in (Verdict.INFRA_ERROR, Verdict.RATE_LIMITED)


_RETRIED_VERDICTS = frozenset({Verdict.INFRA_ERROR, Verdict.RATE_LIMITED, Verdict.INTERRUPTED})
_ERROR_VERDICTS = frozenset(
    {Verdict.INFRA_ERROR, Verdict.RATE_LIMITED, Verdict.INTERRUPTED, Verdict.GAVE_UP}
)
# The verdicts of attempts whose conversation ran to its own end, so `duration_s` is what
# an item of the stratum takes. Not measured: `interrupted` (cut by a drain or a kill),
# `infra_error` and `rate_limited` (cut short by a failure, or stretched to a timeout),
# `gave_up` (the last of those), `substituted` (stopped at the turn another model served,
# and timed on that model).
MEASURED_VERDICTS = frozenset(
    {Verdict.COMPLETED, Verdict.EXPECTATION_FAILED, Verdict.RECURSION_LIMIT, Verdict.BLANK_TURN}
)
_PRECEDENCE = {verdict: rank for rank, verdict in enumerate(Verdict)}


def resolve_verdict(candidates: Iterable[Verdict]) -> Verdict:
    """The verdict that wins when several apply (``completed`` when none does)."""
    return min(candidates, key=_PRECEDENCE.__getitem__, default=Verdict.COMPLETED)
