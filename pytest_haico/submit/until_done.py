"""`haico continue --until-done`: `haico continue` every N minutes until the submission is
finished (0) or a share needs a person (1), backing off while nothing changes. Each round
runs Slurm's queries (squeue, scontrol, sacct), reads the ledgers, and sbatch when it
reruns a share: nothing starts a stack, so it fits a login node or a 1-CPU job."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from pytest_haico.submit.decisions import Action

if TYPE_CHECKING:  # the command line reads the settings below without loading these
    from pytest_haico.submit.continuation import Round
    from pytest_haico.submit.inputs import Submission
    from pytest_haico.submit.jobs import Request, Say

MIN_EVERY_MIN = 1.0
DEFAULT_EVERY_MIN = 5.0
# While nothing changes the interval doubles, up to this many times the one asked for: a
# share that runs for hours is not asked after every minute, and a change is seen within
# a fraction of a walltime.
MAX_BACKOFF = 8
FINISHED = 0
STOPPED = 1

Sleep = Callable[[float], None]
# A round's state: each share's label, end and owed count. Equal states: nothing changed.
_State = tuple[tuple[str, str, int], ...]


def until_done(
    submission: Submission,
    request: Request,
    *,
    every_min: float = DEFAULT_EVERY_MIN,
    say: Say,
    sleep: Sleep = time.sleep,
) -> int:
    """Continue round after round; FINISHED when every share is done, STOPPED (naming the
    share and why) when one needs a person."""
    from pytest_haico.locks import LockHeldError
    from pytest_haico.slurm.client import CommandFailed, NoAnswer
    from pytest_haico.submit.continuation import continue_round
    from pytest_haico.submit.journal import now_iso

    interval = every_min
    previous: _State | None = None
    number = 0
    while True:
        number += 1
        say(f"haico: round {number} at {now_iso()}")
        try:
            result = continue_round(submission, request, say=say)
        except (LockHeldError, NoAnswer, CommandFailed) as exc:
            # Another haico command, or a controller that did not answer: try again later.
            state = None
            why = f"this round could not finish ({exc})"
        else:
            if result.finished:
                say(
                    f"haico: until-done: submission {submission.name} finished in {number} round(s)"
                )
                return FINISHED
            if result.needs_a_person:
                for share, decision in result.needs_a_person:
                    say(f"haico: until-done: stopped at {share.label}: {decision.reason}")
                return STOPPED
            state = None if result.resubmitted else _state(result)
            why = _what_changed(result, _state(result), previous)
        if state is not None and state == previous:
            interval = min(interval * 2, every_min * MAX_BACKOFF)
            why += f": backing off to every {_minutes(interval)}"
        else:
            interval = every_min
        previous = state
        say(f"haico: next round in {_minutes(interval)} ({why})")
        sleep(interval * 60)


def _state(result: Round) -> _State:
    return tuple(
        (share.label, share.evidence.end.text if share.evidence.end else "?", len(share.owed))
        for share, _ in result.decided
    )


def _what_changed(result: Round, state: _State, previous: _State | None) -> str:
    waiting = len(result.decided) - len(result.with_action(Action.DONE))
    if result.resubmitted:
        return f"{result.resubmitted} job(s) resubmitted, {waiting} share(s) not done"
    if previous is None or state != previous:
        return f"{waiting} share(s) not done, pending or running"
    return "nothing changed since the last round"


def _minutes(value: float) -> str:
    return f"{value:g} min"
