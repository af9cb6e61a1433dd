"""The campaign's INT, USR1 and TERM handlers live for its run only."""

from __future__ import annotations

import signal

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
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # as a batch shell's background job inherits
    try:
        signums = (signal.SIGINT, signal.SIGUSR1, signal.SIGTERM)
        before = {s: signal.getsignal(s) for s in signums}
        result = campaign.run()
        after = {s: signal.getsignal(s) for s in signums}
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    result.assert_outcomes(passed=1)
    assert (campaign.root / "seen.txt").read_text() == "True True True "
    assert after == before
    assert before[signal.SIGINT] is signal.SIG_IGN
