"""The campaign's INT and TERM handlers live for its session only."""

from __future__ import annotations

import signal

from tests.campaign.conftest import CampaignDir


def test_an_in_process_campaign_restores_the_signal_handlers_it_replaced(
    campaign: CampaignDir,
) -> None:
    campaign.arm("a")
    campaign.simple_scripts("s1")
    campaign.pytester.makeconftest(
        """
import signal

def pytest_sessionfinish(session):
    # Seen from inside the session: the campaign's handlers are in place.
    with open("seen.txt", "w") as out:
        out.write(f"{signal.getsignal(signal.SIGINT) is signal.default_int_handler} ")
        out.write(f"{signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None)}")
"""
    )
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # as a batch shell's background job inherits
    try:
        before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
        result = campaign.run()
        after = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    result.assert_outcomes(passed=1)
    assert (campaign.root / "seen.txt").read_text() == "True True"
    assert after == before
    assert before[signal.SIGINT] is signal.SIG_IGN
