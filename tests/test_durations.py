"""Durations as text, one style per kind of place."""

from __future__ import annotations

import pytest

from pytest_haico.durations import Style, format_duration


@pytest.mark.parametrize(
    ("style", "seconds", "text"),
    [
        # Messages (the walltime refusal and gate, `haico stack status`).
        ("clock", -5, "0 s"),
        ("clock", 0.4, "0 s"),
        ("clock", 45, "45 s"),
        ("clock", 59.6, "1 min 0 s"),
        ("clock", 250, "4 min 10 s"),
        ("clock", 3599.7, "1 h 0 min"),
        ("clock", 7500, "2 h 5 min"),
        # The job log.
        ("log", -1, "0.0 s"),
        ("log", 0.04, "0.0 s"),
        ("log", 34.24, "34.2 s"),
        ("log", 59.96, "1 m 0 s"),
        ("log", 723, "12 m 3 s"),
        ("log", 7980, "2 h 13 m"),
        # Cost figures.
        ("decimal", 60, "60.0 s"),
        ("decimal", 1302, "21.7 min"),
        ("decimal", 7200, "2.0 h"),
        ("decimal", 3 * 86400, "3.0 d"),
        # Report tables.
        ("cell", 1.234, "1.23 s"),
        ("cell", 45.6, "45.6 s"),
        ("cell", 192, "3.2 m"),
        ("cell", 5400, "1.5 h"),
    ],
)
def test_a_duration_reads_in_its_style(style: Style, seconds: float, text: str) -> None:
    assert format_duration(seconds, style) == text
