"""Durations as text: every message, log line, table cell and cost figure formats them here.

Four styles, each for one kind of place:

    clock     messages: ``45 s``, ``4 min 10 s``, ``2 h 5 min`` (whole seconds)
    log       the job log's lines: ``34.2 s``, ``12 m 3 s``, ``2 h 13 m`` (tenths below a minute)
    decimal   cost figures: ``45.3 s``, ``21.7 min``, ``4.5 h``, ``2.1 d`` (one unit, one decimal)
    cell      report tables: ``1.23 s``, ``45.6 s``, ``3.2 m``, ``1.5 h`` (short, aligned)

A negative duration (a clock stepped back) reads as 0.
"""

from __future__ import annotations

import math
import re
from typing import Literal

Style = Literal["clock", "log", "decimal", "cell"]

MINUTE = 60.0
HOUR = 3600.0
DAY = 86400.0

# One unit per range: (below this many seconds, the unit in seconds, its symbol, decimals).
_OneUnit = tuple[tuple[float, float, str, int], ...]
_DECIMAL: _OneUnit = (
    (2 * MINUTE, 1.0, "s", 1),
    (2 * HOUR, MINUTE, "min", 1),
    (2 * DAY, HOUR, "h", 1),
    (math.inf, DAY, "d", 1),
)
_CELL: _OneUnit = (
    (10.0, 1.0, "s", 2),
    (100.0, 1.0, "s", 1),
    (HOUR, MINUTE, "m", 1),
    (math.inf, HOUR, "h", 1),
)


def format_duration(seconds: float, style: Style = "clock") -> str:
    """`seconds` as text in `style` (see the module's docstring)."""
    seconds = max(seconds, 0.0)
    if style == "clock":
        return _two_units(seconds, minute="min", tenths=False)
    if style == "log":
        return _two_units(seconds, minute="m", tenths=True)
    return _one_unit(seconds, _DECIMAL if style == "decimal" else _CELL)


def _two_units(seconds: float, *, minute: str, tenths: bool) -> str:
    """Seconds; minutes and seconds; hours and minutes."""
    if tenths and round(seconds, 1) < MINUTE:
        return f"{seconds:.1f} s"
    whole = round(seconds)
    if whole < MINUTE:
        return f"{whole} s"
    if whole < HOUR:
        return f"{whole // 60} {minute} {whole % 60} s"
    return f"{whole // 3600} h {whole % 3600 // 60} {minute}"


def _one_unit(seconds: float, ranges: _OneUnit) -> str:
    _, unit, symbol, decimals = next(r for r in ranges if seconds < r[0])
    return f"{seconds / unit:.{decimals}f} {symbol}"


_NO_LIMIT = frozenset({"infinite", "unlimited"})
_SLURM_TIME = re.compile(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?")
#: What `slurm_limit_seconds` takes, for a message.
SLURM_TIME_FORMATS = "MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS or 'infinite'"


def slurm_limit_seconds(text: str) -> float | None:
    """Seconds of a limit as `sbatch --time` takes it (`SLURM_TIME_FORMATS`); None for
    "infinite", "UNLIMITED" or 0 (Slurm reads 0 as no limit); `ValueError` for the rest."""
    value = text.strip()
    if value.lower() in _NO_LIMIT:
        return None
    match = _SLURM_TIME.fullmatch(value)
    if match is None:
        raise ValueError(f"{text!r} is not a Slurm time limit: use {SLURM_TIME_FORMATS}")
    days, first, second, third = (int(part) if part else 0 for part in match.groups())
    if match[1] is not None:  # D-HH[:MM[:SS]]
        seconds = days * DAY + first * HOUR + second * MINUTE + third
    elif match[4] is not None:  # HH:MM:SS
        seconds = first * HOUR + second * MINUTE + third
    else:  # MM[:SS]
        seconds = first * MINUTE + second
    return seconds or None
