"""What the arm runs tell as it happens, for the job log: a stack's start and stop, and each
conversation's record the moment it is on disk."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from pytest_haico.ledger.recorder import ItemAttempt, Recorder
    from pytest_haico.ledger.records import LedgerRecord

_log = logging.getLogger(__name__)


class ArmRunsObserver(Protocol):
    """Told on the thread where it happened: `recorded` on the runner's, as the conversation
    ends and before the item's test is given it; the stack's events on pytest's main thread.
    It must not block for long; what it raises is logged, never raised into the run."""

    def stack_starting(self, arm: str) -> None: ...

    def stack_started(self, arm: str, *, seconds: float, error: str | None) -> None: ...

    def stack_interrupted(self, arm: str, *, seconds: float) -> None:
        """A signal ended the arm's start; its services are stopped."""

    def stack_stopped(self, arm: str, *, seconds: float | None) -> None: ...

    def recorded(self, state: ItemAttempt, record: LedgerRecord) -> None: ...


class ObservedRecorder:
    """The recorder as an arm's run sees it: each record it writes is told to the observer at
    once, on the writing thread; everything else is the recorder's own."""

    def __init__(self, recorder: Recorder, observer: ArmRunsObserver) -> None:
        self._recorder = recorder
        self._observer = observer

    def record(self, state: ItemAttempt, *args: Any, **kwargs: Any) -> LedgerRecord | None:
        record = self._recorder.record(state, *args, **kwargs)
        if record is not None:
            try:
                self._observer.recorded(state, record)
            except Exception:  # the record is on disk: telling of it must not undo that
                _log.exception("haico: the observer of the arm runs failed on a record")
        return record

    def __getattr__(self, name: str) -> Any:
        return getattr(self._recorder, name)
