"""A usage error comes before the ledger, the runner, the stack and their libraries load
(issue 23: a usage error costs 1 s or less over `pytest --version`; benchmarks/startup.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.harness import CampaignProject

# Each test runs a child process (the fast loop, `-m "not slow"`, leaves them out).
pytestmark = pytest.mark.subprocess

# Run pytest in a fresh process, then print the heavy modules it imported.
PROBE = """
import sys, pytest
code = pytest.main(sys.argv[1:])
heavy = ("httpx", "psycopg", "pytest_haico.stack", "pytest_haico.runner",
         "pytest_haico.driver", "pytest_haico.ledger.recorder", "pytest_haico.fixtures")
print("exit", int(code), "heavy", sorted(m for m in sys.modules if m.startswith(heavy)))
"""


@pytest.mark.parametrize(
    ("args", "arm", "line"),
    [
        (["--haico-arm", "nosuch"], "", "*--haico-arm nosuch: no such arm; known arms: demo"),
        (["--haico-concurrency", "0"], "", "*--haico-concurrency: expected an integer from 1*"),
        ([], "nosuchkey = 1\n", "*demo.toml: nosuchkey: unknown key; valid keys here: *"),
    ],
)
def test_a_usage_error_loads_no_stack_runner_or_ledger(
    campaign: CampaignProject, args: list[str], arm: str, line: str
) -> None:
    campaign.arm("demo", arm)
    campaign.simple_scripts("greet")
    done = subprocess.run(
        [sys.executable, "-c", PROBE, "-p", "no:cacheprovider", "experiments", *args],
        cwd=campaign.root,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.stdout.splitlines()[-1] == "exit 4 heavy []", done.stdout + done.stderr
    pytest.LineMatcher(done.stderr.splitlines()).fnmatch_lines([line])
