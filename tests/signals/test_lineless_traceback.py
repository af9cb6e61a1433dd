"""A signal that lands on an instruction without a line number still gets the run's exit
code and summary: pytest's rendering of such a traceback entry fails otherwise."""

from __future__ import annotations

import inspect
import types

import pytest

from pytest_haico.campaign.signals import TerminatedError, drop_lineless_entries


def _terminated_on_a_lineless_instruction() -> TerminatedError:
    """A TerminatedError whose traceback has, in the middle, an entry at an offset without a
    line (here: past the code's end): `tb_lineno` None, as a signal delivered at a
    generator's first instruction leaves under Python 3.11."""
    frame = inspect.currentframe()
    assert frame is not None
    lineless = types.TracebackType(None, frame, 10_000, -1)
    assert lineless.tb_lineno is None
    try:
        raise TerminatedError("SIGTERM: the job is being ended")
    except TerminatedError as error:
        head = error.__traceback__
        assert head is not None
        # head -> lineless -> the rest, as a raise inside that generator would leave it.
        rest = head.tb_next
        head.tb_next = lineless
        lineless.tb_next = rest
        return error


def test_dropping_lineless_entries_lets_pytest_render_the_interrupt() -> None:
    # (Without it, pytest's getrepr raises TypeError on such an entry: pytest 9.2.)
    error = _terminated_on_a_lineless_instruction()
    head = error.__traceback__
    context = _terminated_on_a_lineless_instruction()
    error.__context__ = context

    drop_lineless_entries(error)

    assert error.__traceback__ is head  # whoever holds the head sees the rest
    for chained in (error, context):
        entry = chained.__traceback__
        while entry is not None:
            assert entry.tb_lineno is not None
            entry = entry.tb_next
    rendered = pytest.ExceptionInfo.from_exception(error).getrepr(funcargs=True)
    assert rendered.reprcrash is not None
    assert "SIGTERM: the job is being ended" in rendered.reprcrash.message
