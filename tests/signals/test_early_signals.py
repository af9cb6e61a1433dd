"""A signal in a run's first seconds, before the campaign's handlers: held from the plugin's
registration, then the campaign ends the campaign's way (exit 75, one line, nothing left);
a session that runs no campaign gets the signal as it would have without the plugin."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.harness import CampaignProject, start_pytest

# A conftest whose hook `{hook}` marks that it has begun, then waits for the test's go file:
# the test signals the run in that phase, then lets it go on.
WAIT_IN_HOOK = """
import pathlib
import time

import pytest


@pytest.hookimpl(tryfirst=True)
def {hook}({argument}):
    pathlib.Path("{marker}").touch()
    deadline = time.monotonic() + 120  # the test lets it go long before; never wait for ever
    while not pathlib.Path("{go}").exists():
        if time.monotonic() > deadline:
            raise RuntimeError("the test never wrote {go}")
        time.sleep(0.02)
"""


def wait_in(directory: Path, hook: str, argument: str) -> tuple[Path, Path]:
    """Write `directory/conftest.py` that holds `hook` until the go file exists; the marker
    and go files."""
    marker, go = directory / f"{hook}.began", directory / f"{hook}.go"
    (directory / "conftest.py").write_text(
        WAIT_IN_HOOK.format(hook=hook, argument=argument, marker=marker, go=go)
    )
    return marker, go


@pytest.mark.parametrize(
    ("signum", "code"), [(signal.SIGTERM, 75), (signal.SIGUSR1, 75), (signal.SIGINT, 2)]
)
def test_a_signal_while_pytest_configures_ends_the_campaign_with_one_line(
    campaign: CampaignProject, signum: signal.Signals, code: int
) -> None:
    """(A SIGINT in strict mode, the default, exits with pytest's own 2.)"""
    campaign.arm("demo")
    campaign.simple_scripts("s1", "s2")
    marker, go = wait_in(campaign.experiments, "pytest_configure", "config")
    run = campaign.start()
    run.wait_for(marker.exists, timeout=120, what="pytest configuring")
    run.send_signal(signum)  # before the plugin knows this is a campaign
    go.touch()
    assert run.wait(timeout=60) == code, run.output()
    output = run.output()
    line = f"{signum.name} before the campaign started (exit {code}): nothing ran, nothing was"
    assert output.count(line) == 1, output  # in the haico summary, and nowhere else
    assert "Exit:" not in output and "!!!" not in output and "Traceback" not in output
    assert not (campaign.root / "results").exists()


def test_a_term_at_session_start_ends_the_campaign_its_way(campaign: CampaignProject) -> None:
    campaign.arm("demo")
    campaign.simple_scripts("s1", "s2")
    marker, go = wait_in(campaign.experiments, "pytest_sessionstart", "session")
    run = campaign.start()
    run.wait_for(marker.exists, timeout=120, what="the session starting")
    run.send_signal(signal.SIGTERM)  # the campaign's handlers are in, its session not yet
    go.touch()
    assert run.wait(timeout=60) == 75, run.output()
    assert "terminated (exit 75): SIGTERM" in run.output()
    assert "0 recorded interrupted, 0 not started" in run.output()
    assert campaign.records("demo") == []


def test_a_term_while_a_session_without_campaign_configures_is_pythons_default(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_unit="def test_unit():\n    pass\n")
    marker, go = wait_in(pytester.path, "pytest_configure", "config")
    run = start_pytest(pytester, "-p", "no:cacheprovider", log=pytester.path / "run.out")
    try:
        run.wait_for(marker.exists, timeout=120, what="pytest configuring")
        run.send_signal(signal.SIGTERM)
        go.touch()
        assert run.wait(timeout=60) == -signal.SIGTERM, run.output()
    finally:
        run.stop()
