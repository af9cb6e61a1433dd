"""A finished conversation as a test sees it (`haico_conversation`), and its explanation."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pytest_haico.config.items import ItemSpec
from pytest_haico.driver.expectations import describe_failure
from pytest_haico.driver.result import ConversationResult
from pytest_haico.ledger.records import LedgerRecord, TurnRecord
from pytest_haico.ledger.verdicts import Verdict


@dataclass(frozen=True)
class Conversation:
    """A finished conversation: what the `haico_conversation` fixture gives a test.

    For a hand-written assertion: `answers` (each turn's final text), `turns` (each
    turn's metrics and checked expectations, as recorded), `verdict`, `record`.
    """

    spec: ItemSpec
    result: ConversationResult
    record: LedgerRecord | None
    # `<arm>/transcripts/<item_id>.<run_id>.<attempt>.jsonl`, when the runner knows it.
    transcript: Path | None = None

    @property
    def verdict(self) -> Verdict:
        return self.record.verdict if self.record is not None else self.result.verdict

    @property
    def turns(self) -> tuple[TurnRecord, ...]:
        """Each turn's metrics and expectations, as the ledger has them (redacted)."""
        return self.record.turns if self.record is not None else self.result.turns

    @property
    def answers(self) -> tuple[str, ...]:
        """Each turn's answer: the text of its final step (redacted; "" for a turn cut
        short)."""
        return self.result.answers

    @property
    def failed_expectations(self) -> list[str]:
        """One line per expectation the conversation missed, in turn order:
        ``turn 2: expected the answer to contain 'Crete', got '...' (41 chars)``."""
        return [
            describe_failure(turn.index, result)
            for turn in self.turns
            for result in turn.expectations
            if not result.passed
        ]

    def explain(self) -> str:
        """What a failing assertion shows: the verdict, after how many turns, and why; then
        each missed expectation that line does not already name, one a line."""
        error = self.record.error if self.record is not None else self.result.error
        text = f"{self.spec.test_id}: {self.verdict.value} after {len(self.turns)} turn(s)"
        if error is not None and error.kind == self.verdict.value:
            text += f": {error.message}"  # the kind is the verdict: said once
        elif error is not None:
            text += f" ({error.kind}: {error.message})"
        named = error.message if error is not None else None
        return "\n".join(
            [text, *(f"  {line}" for line in self.failed_expectations if line != named)]
        )
