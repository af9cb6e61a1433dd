"""The campaign's INT, USR1 and TERM handlers live for its run only."""

from __future__ import annotations

import signal

import pytest

from tests.harness import CampaignProject


def test_an_in_process_campaign_restores_the_signal_handlers_it_replaced(
    campaign: CampaignProject,
) -> None:
    campaign.arm("a")
    campaign.simple_scripts("s1")
    campaign.pytester.makeconftest(
        """
import signal

def pytest_sessionfinish(session):
    # Seen from inside the session: the campaign's handlers are in place.
    with open("seen.txt", "w") as out:
        for signum in (signal.SIGINT, signal.SIGUSR1, signal.SIGTERM):
            handler = signal.getsignal(signum)
            out.write(f"{getattr(handler, '__module__', None) == 'pytest_haico.campaign.signals'} ")
"""
    )
    # As a batch shell's background job inherits it.
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        signums = (signal.SIGINT, signal.SIGUSR1, signal.SIGTERM)
        before = {s: signal.getsignal(s) for s in signums}
        result = campaign.run()
        after = {s: signal.getsignal(s) for s in signums}
    finally:
        signal.signal(signal.SIGINT, previous)
    result.assert_outcomes(passed=1)
    assert (campaign.root / "seen.txt").read_text() == "True True True "
    assert after == before
    assert before[signal.SIGINT] is signal.SIG_IGN


# A conftest that writes, for INT, USR1 and TERM, whether the campaign's handler is in place
# once collection is done (before any test or stack runs).
SEEN_AT_COLLECTION = """
import signal

def pytest_collection_finish(session):
    with open("seen.txt", "w") as out:
        for signum in (signal.SIGINT, signal.SIGUSR1, signal.SIGTERM):
            handler = signal.getsignal(signum)
            out.write(f"{getattr(handler, '__module__', None) == 'pytest_haico.campaign.signals'} ")
"""


@pytest.mark.subprocess
def test_a_run_beside_the_experiments_leaves_the_signal_handlers_alone(
    campaign: CampaignProject,
) -> None:
    campaign.arm("a")
    campaign.simple_scripts("s1")
    # A real process; a plugin named by -p is imported before the entry points (ours).
    campaign.pytester.makepyfile(
        inherited_handlers="""
import signal

import pytest

SIGNALS = (signal.SIGINT, signal.SIGUSR1, signal.SIGTERM)
INHERITED = {signum: signal.getsignal(signum) for signum in SIGNALS}


@pytest.fixture
def inherited():
    return INHERITED
"""
    )
    campaign.pytester.makepyfile(
        **{
            "tests/test_unit.py": """
import signal

def test_handlers(inherited):
    assert {signum: signal.getsignal(signum) for signum in inherited} == inherited
"""
        }
    )
    result = campaign.pytester.runpytest_subprocess(
        "tests", "-p", "no:cacheprovider", "-p", "inherited_handlers"
    )
    result.assert_outcomes(passed=1)


@pytest.mark.parametrize("fixture", ["haico_item", "haico_stack"])
def test_a_campaign_test_collected_beside_the_experiments_gets_the_handlers(
    campaign: CampaignProject, fixture: str
) -> None:
    campaign.arm("a")
    campaign.simple_scripts("s1")
    campaign.pytester.makeconftest(SEEN_AT_COLLECTION)
    campaign.pytester.makepyfile(
        **{"tests/test_campaign.py": f"def test_campaign({fixture}):\n    pass\n"}
    )
    result = campaign.pytester.runpytest("tests", "-p", "no:cacheprovider", "--collect-only")
    assert result.ret == 0, result.stdout.str()
    assert (campaign.root / "seen.txt").read_text() == "True True True "


def test_a_run_of_plain_tests_beside_the_experiments_installs_no_handler(
    campaign: CampaignProject,
) -> None:
    campaign.arm("a")
    campaign.simple_scripts("s1")
    campaign.pytester.makeconftest(SEEN_AT_COLLECTION)
    campaign.pytester.makepyfile(**{"tests/test_unit.py": "def test_unit():\n    pass\n"})
    result = campaign.pytester.runpytest("tests", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    assert (campaign.root / "seen.txt").read_text() == "False False False "
