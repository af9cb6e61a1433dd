"""The circuit breaker: 5 of the last 8 trips it, older failures slide out of the window."""

from __future__ import annotations

import pytest

from pytest_haico.runner.breaker import CircuitBreaker


def feed(breaker: CircuitBreaker, pattern: str) -> list[bool]:
    """Observe one conversation per letter: F failed on infrastructure, . did not."""
    return [breaker.observe(letter == "F", service="backend") for letter in pattern]


def test_five_failures_of_the_last_eight_trip_it_and_four_do_not() -> None:
    breaker = CircuitBreaker()
    assert feed(breaker, "FF.F..F") == [False] * 7
    assert not breaker.tripped
    assert feed(breaker, "F") == [True]
    assert breaker.tripped


def test_old_failures_slide_out_of_the_window() -> None:
    breaker = CircuitBreaker(window=8, threshold=5)
    # The first F has slid out by the ninth observation: 4 of the last 8.
    assert not any(feed(breaker, "FFFF....F"))
    assert breaker.reason() == (
        "4 of the last 8 conversations failed on infrastructure (mostly: backend)"
    )
    # Each new failure pushes an old one out, until the successes have gone.
    assert feed(breaker, "FFFF") == [False, False, False, True]


def test_once_tripped_it_stays_tripped_with_its_reason() -> None:
    breaker = CircuitBreaker(window=3, threshold=2)
    assert feed(breaker, "FF") == [False, True]
    assert feed(breaker, "....") == [True] * 4
    assert breaker.tripped
    assert (
        breaker.reason()
        == "2 of the last 2 conversations failed on infrastructure (mostly: backend)"
    )


def test_the_reason_names_the_service_that_failed_most() -> None:
    breaker = CircuitBreaker()
    for service in ["vllm", "backend", None, "backend", None, "vllm"]:
        breaker.observe(service is not None, service=service)
    assert not breaker.tripped
    assert breaker.observe(True, service="backend")
    assert breaker.reason() == (
        "5 of the last 7 conversations failed on infrastructure (mostly: backend)"
    )


def test_the_reason_names_no_service_when_none_was_given() -> None:
    breaker = CircuitBreaker(window=2, threshold=1)
    assert breaker.observe(True)
    assert breaker.reason() == "1 of the last 1 conversations failed on infrastructure"


@pytest.mark.parametrize(("window", "threshold"), [(8, 9), (8, 0), (0, 0)])
def test_an_impossible_threshold_is_refused(window: int, threshold: int) -> None:
    with pytest.raises(ValueError, match=f"got {threshold} of {window}"):
        CircuitBreaker(window=window, threshold=threshold)
