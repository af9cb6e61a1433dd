"""Why an arm run stops before its items are done: a drain (USR1, the walltime), and a
signal during a stack's start."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Drain:
    """A graceful stop: nothing new starts; what is in flight gets `timeout_s`, then is
    cancelled and recorded interrupted."""

    reason: str
    timeout_s: float
    in_flight: int  # conversations in flight when it began
    ended_early: bool = False  # a second USR1 cancelled what was still in flight


def interrupted_start_line(arm: str, interrupt: KeyboardInterrupt, *, seconds: float) -> str:
    """What a signal during an arm's start did: the one line the session ends with."""
    cause = str(interrupt) or "SIGINT"  # Ctrl-C's KeyboardInterrupt says nothing
    return (
        f"haico: interrupted while starting the stack of arm {arm} ({cause}) after "
        f"{seconds:.1f} s: its services are stopped, nothing ran and nothing was recorded"
    )
