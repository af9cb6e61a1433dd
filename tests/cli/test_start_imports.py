"""What a `haico` command imports before it runs: the parser of every command, and for
`haico report` the results API and the report. Neither pytest nor pydantic is among them
(together about 0.4 s of every command's start)."""

from __future__ import annotations

import subprocess
import sys

import pytest

# Each test runs a child process (the fast loop, `-m "not slow"`, leaves them out).
pytestmark = pytest.mark.subprocess


@pytest.mark.parametrize("package", ["pytest", "_pytest", "pydantic"])
def test_haico_report_starts_without_importing(package: str) -> None:
    probe = (
        "import sys, pytest_haico.cli.main, pytest_haico.report.terminal; "
        f"print(sorted(m for m in sys.modules if m.split('.')[0] == {package!r}))"
    )
    shown = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout
    assert shown == "[]\n"
