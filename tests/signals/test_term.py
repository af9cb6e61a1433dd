"""SIGTERM, the emergency path: in-flight items recorded interrupted at once, no final dump,
the stack stopped, exit 75 in both modes."""

from __future__ import annotations

import signal

from tests.harness import CampaignProject
from tests.signals.conftest import (
    ARTIFACT_TURN,
    HANGING_ARM,
    dumps,
    hanging_requests,
    llm_log_count,
    restorable,
    run_dir,
    services_alive,
    stack_campaign,
    verdicts,
)


def test_term_records_the_conversations_in_flight_interrupted_and_writes_no_final_dump(
    campaign: CampaignProject,
) -> None:
    stack_campaign(campaign, HANGING_ARM, items=4, text=ARTIFACT_TURN)
    run = campaign.start("--haico-drain-timeout", "600")  # TERM does not drain
    run.wait_for(lambda: hanging_requests(campaign) >= 2, timeout=120, what="2 in flight")
    run.send_signal(signal.SIGTERM)
    assert run.wait(timeout=60) == 75, run.output()
    assert verdicts(campaign) == ["interrupted", "interrupted"]
    # Each keeps the turn it was in, the item pytest was waiting on included.
    assert all(len(record["turns"]) == 1 for record in campaign.records("demo"))
    assert "terminated (exit 75): SIGTERM" in run.output()
    assert "no final dump\n" in run.output()  # and no promise of a periodic one
    run_path = run_dir(campaign)
    assert dumps(run_path, "final") == []
    assert services_alive(run_path) == []


def test_term_keeps_the_newest_periodic_dump(campaign: CampaignProject) -> None:
    stack_campaign(campaign, HANGING_ARM, items=4, text=ARTIFACT_TURN)
    run = campaign.start("--haico-dump-interval", "1")
    run.wait_for(lambda: hanging_requests(campaign) >= 2, timeout=120, what="2 in flight")
    run.wait_for(
        lambda: dumps(run_dir(campaign), "periodic") != [], timeout=60, what="a periodic dump"
    )
    run.send_signal(signal.SIGTERM)
    assert run.wait(timeout=60) == 75, run.output()
    run_path = run_dir(campaign)
    periodic = dumps(run_path, "periodic")
    assert len(periodic) == 1 and restorable(periodic[0])
    assert dumps(run_path, "final") == []
    assert [p.name for p in (run_path / "dumps").iterdir() if p.name.startswith(".")] == []


def test_term_while_the_stack_starts_stops_it_and_records_nothing(
    campaign: CampaignProject,
) -> None:
    stack_campaign(campaign, "[standin]\nload_s = 120\n", items=3)
    run = campaign.start()
    run.wait_for(
        lambda: llm_log_count(campaign, "loading the model") >= 1,
        timeout=120,
        what="the model server loading",
    )
    run.send_signal(signal.SIGTERM)
    assert run.wait(timeout=50) == 75, run.output()
    assert campaign.records("demo") == []
    assert services_alive(run_dir(campaign)) == []


# Sends SIGTERM to the run itself right after the arm's run object is made: after its static
# gates, before its stack starts (the window of the modules the start imports).
TERM_BEFORE_THE_START = """
import os
import signal

from pytest_haico.runner import arm_run

_made = arm_run.ArmRun.__init__


def _made_then_terminated(self, *args, **kwargs):
    _made(self, *args, **kwargs)
    os.kill(os.getpid(), signal.SIGTERM)
    (lambda: None)()  # a Python call: the handler runs here, in this window


arm_run.ArmRun.__init__ = _made_then_terminated
"""


def test_term_between_the_static_gates_and_the_stack_start_starts_no_service(
    campaign: CampaignProject,
) -> None:
    stack_campaign(campaign, "", items=2)
    campaign.write("conftest.py", TERM_BEFORE_THE_START)
    run = campaign.start()
    assert run.wait(timeout=60) == 75, run.output()
    assert "terminated (exit 75): SIGTERM" in run.output()
    assert campaign.records("demo") == []
    # No service was spawned: the stack did not start (and then stop) first.
    assert list(run_dir(campaign).glob("logs/*.log")) == []
