"""How `haico` commands print: lines to stdout, warnings to stderr, and a quick exit."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import NoReturn

Say = Callable[[str], None]
Finish = Callable[[int], NoReturn]


def warn(message: str) -> None:
    """One line on stderr, prefixed as every haico message is."""
    print(f"haico: {message}", file=sys.stderr)


def exit_now(status: int) -> NoReturn:
    """End the process with `status` once what it printed is out; nothing is freed."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
