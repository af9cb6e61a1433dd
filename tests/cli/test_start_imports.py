"""What a `haico` command imports before it runs: the parser of every command, and for
`haico report` the results API and the report. pytest is not among them (a quarter of a
second of every command's start)."""

from __future__ import annotations

import subprocess
import sys


def test_haico_report_starts_without_importing_pytest() -> None:
    probe = (
        "import sys, pytest_haico.cli.main, pytest_haico.report.terminal; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pytest', '_pytest')))"
    )
    shown = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout
    assert shown == "[]\n"
