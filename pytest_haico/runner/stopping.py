"""Why this session's arm runs stopped short: one `StopCause` per kind, held by `Stops`, the
one place that knows their precedence (which decides the exit code and leads the summary)
and which of them keep a new stack from starting; and the line a signal during a stack's
start ends the session with."""

from __future__ import annotations

import enum
from collections.abc import Iterator
from dataclasses import dataclass

EXIT_RESUBMIT = 75
EXIT_STACK_FAILED = 78


class StopKind(enum.Enum):
    """Why a run stopped short, in precedence order: the first present gives the exit code.

    The first three are an arm's start that failed (the session's first such failure
    only); the others end a run that had started, and may come together (a drain cut short
    by SIGTERM)."""

    GATE_FAILED = "gate failed"  # a gate refused the arm before its first item
    STACK_FAILED = "stack failed"  # the arm's stack did not start
    SHORT_OF_TIME = "too little time left"  # the walltime gate: less left than one item costs
    STOPPED = "stopped"  # a tripped breaker, a dead service, a record that was not written
    TERMINATED = "terminated"  # SIGTERM: stop now, no final dump
    DRAINED = "drained"  # USR1 (or the walltime): nothing new starts, in-flight ones finish
    NOT_ADMITTING = "stopped admitting"  # the walltime admission refused the next item

    @property
    def exit_code(self) -> int:
        """78 for a gate or stack that failed; 75 (resubmit) for the rest: too little time
        is a cost shortfall, not a fault of the inputs."""
        if self in (StopKind.GATE_FAILED, StopKind.STACK_FAILED):
            return EXIT_STACK_FAILED
        return EXIT_RESUBMIT

    @property
    def failed_start(self) -> bool:
        return self in _FAILED_STARTS


_FAILED_STARTS = frozenset({StopKind.GATE_FAILED, StopKind.STACK_FAILED, StopKind.SHORT_OF_TIME})
# What keeps a new stack from starting, and the reason given for it, in this order.
_NO_NEW_STACK = (StopKind.TERMINATED, StopKind.DRAINED, StopKind.NOT_ADMITTING)


@dataclass
class Drain:
    """A graceful stop's details: nothing new starts; what is in flight gets `timeout_s`,
    then is cancelled and recorded interrupted."""

    timeout_s: float
    in_flight: int  # conversations in flight when it began
    ended_early: bool = False  # a second USR1 cancelled what was still in flight


@dataclass(frozen=True)
class StopCause:
    """One reason the session's runs stopped short."""

    kind: StopKind
    reason: str
    drain: Drain | None = None  # DRAINED: its grace and what was in flight

    @property
    def exit_code(self) -> int:
        return self.kind.exit_code


class Stops:
    """Every cause that stopped this session's runs: the first of each kind is kept (a
    second SIGTERM, a second breaker say nothing new), and only the first failed start."""

    def __init__(self) -> None:
        self._causes: dict[StopKind, StopCause] = {}

    def add(self, cause: StopCause) -> StopCause:
        """Keep `cause` unless one of its kind (or, for a failed start, any failed start) is
        kept already; the one kept."""
        if cause.kind.failed_start and self.failed_start is not None:
            return self.failed_start
        return self._causes.setdefault(cause.kind, cause)

    def get(self, kind: StopKind) -> StopCause | None:
        return self._causes.get(kind)

    def reason(self, kind: StopKind) -> str | None:
        cause = self._causes.get(kind)
        return cause.reason if cause is not None else None

    def __iter__(self) -> Iterator[StopCause]:
        """The causes kept, in precedence order."""
        return (self._causes[kind] for kind in StopKind if kind in self._causes)

    @property
    def first(self) -> StopCause | None:
        """The cause that decides the exit code."""
        return next(iter(self), None)

    @property
    def failed_start(self) -> StopCause | None:
        """The session's first arm start that failed (a gate, the stack), if one did."""
        return next((cause for cause in self if cause.kind.failed_start), None)

    @property
    def stopped_short(self) -> bool:
        """Whether a breaker, a dead service, a drain, the walltime or SIGTERM ended a run
        that had started."""
        return any(not cause.kind.failed_start for cause in self)

    @property
    def drain(self) -> Drain | None:
        cause = self._causes.get(StopKind.DRAINED)
        return cause.drain if cause is not None else None

    def no_new_stack(self) -> str | None:
        """Why no stack may start any more (SIGTERM, a drain, the walltime), or None."""
        return next(
            (self._causes[kind].reason for kind in _NO_NEW_STACK if kind in self._causes), None
        )


def interrupted_start_line(arm: str, interrupt: KeyboardInterrupt, *, seconds: float) -> str:
    """What a signal during an arm's start did: the one line the session ends with."""
    cause = str(interrupt) or "SIGINT"  # Ctrl-C's KeyboardInterrupt says nothing
    return (
        f"haico: interrupted while starting the stack of arm {arm} ({cause}) after "
        f"{seconds:.1f} s: its services are stopped, nothing ran and nothing was recorded"
    )
