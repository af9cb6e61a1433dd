"""The resume index: each item's newest record, and what its next attempt is."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from pytest_haico.ledger.format import RawRecord, Warn
from pytest_haico.ledger.verdicts import Verdict


@dataclass(frozen=True, slots=True)
class Prior:
    """The newest record of an item: enough to decide whether and how it runs again."""

    verdict: Verdict
    attempt: int
    finished_at: str

    @property
    def done(self) -> bool:
        return self.verdict.is_terminal

    @property
    def next_attempt(self) -> int:
        """Infra failures use up an attempt; an interrupted attempt is simply run again."""
        return self.attempt if self.verdict is Verdict.INTERRUPTED else self.attempt + 1


class ResumeIndex:
    """item_id → newest `Prior`, built by streaming ledgers once."""

    def __init__(self) -> None:
        self._priors: dict[str, Prior] = {}
        self.records = 0

    def __len__(self) -> int:
        return len(self._priors)

    def get(self, item_id: str) -> Prior | None:
        return self._priors.get(item_id)

    def add_all(self, records: Iterable[RawRecord], *, warn: Warn) -> None:
        verdicts = {verdict.value: verdict for verdict in Verdict}
        priors = self._priors
        for record in records:
            data = record.data
            item_id = data.get("item_id")
            verdict = verdicts.get(data.get("verdict"))  # type: ignore[arg-type]
            attempt = data.get("attempt")
            finished_at = data.get("finished_at")
            if (
                not isinstance(item_id, str)
                or verdict is None
                or not isinstance(attempt, int)
                or not isinstance(finished_at, str)
            ):
                warn(
                    f"{record.path}:{record.line}: skipped a record without a valid "
                    "item_id, verdict, attempt or finished_at"
                )
                continue
            self.records += 1
            known = priors.get(item_id)
            # Later lines win ties: files are read in run order, lines in write order.
            if known is None or finished_at >= known.finished_at:
                priors[item_id] = Prior(verdict, attempt, finished_at)
