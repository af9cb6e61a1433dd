"""A USR1 or TERM while an arm's dynamic gates run (its canary turn in flight): the start
ends at its next step, the gate under way is cancelled, every service stops, nothing is
recorded, and the run exits 75 long before the gate's own timeout."""

from __future__ import annotations

import json
import signal

import pytest

from tests.harness import CampaignProject
from tests.signals.conftest import run_dir, services_alive, stack_campaign

# Every model request takes 1.5 s: the canary turn is in flight for seconds, and a gate
# that was not cancelled would hold the run for its 60 s turn timeout.
SLOW_MODEL = "[standin]\nlatency_ms = 1500\n"


@pytest.mark.parametrize("signum", [signal.SIGUSR1, signal.SIGTERM], ids=["USR1", "TERM"])
def test_a_signal_during_the_canary_turn_stops_the_stack_and_records_nothing(
    campaign: CampaignProject, signum: signal.Signals
) -> None:
    stack_campaign(campaign, SLOW_MODEL, items=2)
    run = campaign.start()
    run.wait_for(
        lambda: any((campaign.arm_dir("demo") / "runs").glob("*/canary.1.jsonl")),
        timeout=120,
        what="the canary turn",
    )
    run.send_signal(signum)
    assert run.wait(timeout=30) == 75, run.output()
    assert campaign.records("demo") == []
    path = run_dir(campaign)
    assert services_alive(path) == []
    # The static gates and the model server's passed; the canary was cut short, not failed.
    gates = json.loads((path / "gates.json").read_text())["gates"]
    assert gates and all(gate["passed"] for gate in gates), gates
    assert "canary_turn" not in [gate["name"] for gate in gates]
