"""How a conversation ended: its verdict, its turns as recorded, its answers and times."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from pytest_haico.ledger.records import ErrorInfo, TurnRecord
from pytest_haico.ledger.times import AttemptTimes
from pytest_haico.ledger.verdicts import Verdict


@dataclass(frozen=True, slots=True)
class ConversationResult:
    """How a conversation ended: its verdict, per-turn metrics and the winning reason."""

    verdict: Verdict
    turns: tuple[TurnRecord, ...]
    error: ErrorInfo | None
    times: AttemptTimes  # the conversation's own start and monotonic duration
    # Each turn's answer (its final step's text, redacted), one per entry of `turns`.
    answers: tuple[str, ...] = ()

    @property
    def started_at(self) -> datetime:
        return self.times.started_at

    @property
    def finished_at(self) -> datetime:
        return self.times.finished_at

    @property
    def duration_s(self) -> float:
        return self.times.duration_s
