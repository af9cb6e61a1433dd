"""Why the runs stopped short: one cause per kind, the first failed start only, and one
precedence for the exit code, the summary's order and whether a new stack may start."""

from __future__ import annotations

from pytest_haico.runner.stopping import Drain, StopCause, StopKind, Stops


def test_the_first_cause_by_precedence_decides_the_exit_code() -> None:
    stops = Stops()
    assert stops.first is None and not stops.stopped_short
    stops.add(StopCause(StopKind.DRAINED, "SIGUSR1: draining", drain=Drain(120, 2)))
    assert stops.first is not None and stops.first.exit_code == 75
    stops.add(StopCause(StopKind.GATE_FAILED, "arm demo: gate canary failed"))
    assert stops.first.kind is StopKind.GATE_FAILED and stops.first.exit_code == 78
    assert [cause.kind for cause in stops] == [StopKind.GATE_FAILED, StopKind.DRAINED]


def test_too_little_time_is_a_failed_start_that_exits_75() -> None:
    stops = Stops()
    stops.add(StopCause(StopKind.SHORT_OF_TIME, "arm demo: gate walltime failed"))
    assert stops.failed_start is not None and stops.failed_start.exit_code == 75
    assert not stops.stopped_short


def test_only_the_first_failed_start_and_the_first_of_each_kind_are_kept() -> None:
    stops = Stops()
    first = stops.add(StopCause(StopKind.STACK_FAILED, "the stack of arm a did not start"))
    assert stops.add(StopCause(StopKind.GATE_FAILED, "arm b: gate canary failed")) is first
    stops.add(StopCause(StopKind.STOPPED, "circuit breaker"))
    stops.add(StopCause(StopKind.STOPPED, "postgres died"))
    assert [(c.kind, c.reason) for c in stops] == [
        (StopKind.STACK_FAILED, "the stack of arm a did not start"),
        (StopKind.STOPPED, "circuit breaker"),
    ]
    assert stops.stopped_short


def test_sigterm_then_a_drain_then_the_walltime_keep_new_stacks_from_starting() -> None:
    stops = Stops()
    assert stops.no_new_stack() is None
    stops.add(StopCause(StopKind.STOPPED, "circuit breaker"))
    assert stops.no_new_stack() is None  # the other arms may still run
    stops.add(StopCause(StopKind.NOT_ADMITTING, "the walltime is nearly spent"))
    assert stops.no_new_stack() == "the walltime is nearly spent"
    stops.add(StopCause(StopKind.DRAINED, "SIGUSR1: draining", drain=Drain(120, 0)))
    assert stops.no_new_stack() == "SIGUSR1: draining"
    stops.add(StopCause(StopKind.TERMINATED, "SIGTERM"))
    assert stops.no_new_stack() == "SIGTERM"
    assert stops.drain is not None and stops.drain.timeout_s == 120
