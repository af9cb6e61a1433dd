"""SIGUSR1, the graceful path: nothing new starts, what is in flight gets the drain timeout,
the final dump is written while Postgres is up, the stack stops, exit 75 in both modes."""

from __future__ import annotations

import json
import signal
from collections import Counter

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

SLOW_ARM = """
[run]
concurrency = 2
[standin]
latency_ms = 1500
"""


def test_usr1_lets_the_conversations_in_flight_finish_and_starts_nothing_new(
    campaign: CampaignProject,
) -> None:
    stack_campaign(campaign, SLOW_ARM, items=30)
    run = campaign.start()  # strict mode: a drain still exits 75
    run.wait_for(lambda: campaign.ledger_lines("demo") != [], timeout=120, what="a record")
    run.send_signal(signal.SIGUSR1)
    assert run.wait(timeout=120) == 75, run.output()
    output = run.output()
    assert "haico: SIGUSR1: draining: nothing new starts;" in output
    assert "drained (exit 75): SIGUSR1: draining:" in output
    done = verdicts(campaign)
    assert 1 <= len(done) < 30
    assert set(done) == {"completed"}  # the drain timeout (120 s) covered every one
    run_path = run_dir(campaign)
    (final,) = dumps(run_path, "final")
    assert restorable(final)
    assert services_alive(run_path) == []
    # The timeline names the drain's cause and the exit the job ended with.
    timeline = json.loads((run_path / "timeline.json").read_text())
    drain = timeline["phases"]["drain"]
    assert (drain["cause"], drain["signal"], timeline["exit"]["code"]) == ("signal", "SIGUSR1", 75)
    assert drain["start"] <= timeline["phases"]["conversing"]["last_end"] <= drain["end"]

    # Resubmitting the same command finishes the rest, and nothing twice.
    again = campaign.run_subprocess("--haico-exit", "campaign")
    assert again.ret == 0, again.stdout.str()
    records = campaign.records("demo")
    assert Counter(r["verdict"] for r in records) == {"completed": 30}
    assert len({r["item_id"] for r in records}) == 30


def test_what_outlasts_the_drain_timeout_is_cancelled_and_recorded_interrupted(
    campaign: CampaignProject,
) -> None:
    stack_campaign(campaign, HANGING_ARM, items=6, text=ARTIFACT_TURN)
    run = campaign.start("--haico-drain-timeout", "2", "--haico-exit", "campaign")
    run.wait_for(lambda: hanging_requests(campaign) >= 2, timeout=120, what="2 in flight")
    run.send_signal(signal.SIGUSR1)
    assert run.wait(timeout=120) == 75, run.output()
    assert verdicts(campaign) == ["interrupted", "interrupted"]
    assert (
        "drained (exit 75): SIGUSR1: draining: 2 conversation(s) in flight were given "
        "--haico-drain-timeout 2 s, then cancelled; 2 recorded interrupted, 4 not started"
    ) in run.output()
    # The job log: what ended in the drain has no ETA, what is left will not run in this job.
    ended = [line for line in run.output().splitlines() if line.startswith("[")]
    assert [line.split(" · ")[-1] for line in ended] == ["stopping", "stopping"], run.output()
    assert all(line.startswith(("[1/6] demo ", "[2/6] demo ")) for line in ended), ended
    assert all(" interrupted " in line for line in ended), ended
    run_path = run_dir(campaign)
    (final,) = dumps(run_path, "final")
    assert restorable(final)
    assert services_alive(run_path) == []


def test_a_second_usr1_ends_the_drain_at_once(campaign: CampaignProject) -> None:
    stack_campaign(campaign, HANGING_ARM, items=4, text=ARTIFACT_TURN)
    run = campaign.start("--haico-drain-timeout", "600")
    run.wait_for(lambda: hanging_requests(campaign) >= 2, timeout=120, what="2 in flight")
    run.send_signal(signal.SIGUSR1)
    run.wait_for(lambda: "SIGUSR1: draining" in run.output(), timeout=60, what="the drain")
    run.send_signal(signal.SIGUSR1)
    # Without the second signal the drain would wait 600 s.
    assert run.wait(timeout=120) == 75, run.output()
    assert "haico: SIGUSR1 again: the drain ends now" in run.output()
    assert "ended early by a second USR1" in run.output()
    assert verdicts(campaign) == ["interrupted", "interrupted"]


def test_usr1_while_the_stack_starts_stops_it_and_records_nothing(
    campaign: CampaignProject,
) -> None:
    # The stand-in model server takes 120 s to "load", twice its start timeout: without the
    # signal this run would end 78 after a minute.
    stack_campaign(campaign, "[standin]\nload_s = 120\n", items=3)
    run = campaign.start()
    run.wait_for(
        lambda: llm_log_count(campaign, "loading the model") >= 1,
        timeout=120,
        what="the model server loading",
    )
    run.send_signal(signal.SIGUSR1)
    assert run.wait(timeout=50) == 75, run.output()
    assert campaign.records("demo") == []
    assert services_alive(run_dir(campaign)) == []


def test_plain_items_after_usr1_are_skipped_not_started(campaign: CampaignProject) -> None:
    campaign.arm("a")
    campaign.simple_scripts(*(f"s{i:02d}" for i in range(20)))
    run = campaign.start("-rs", env={"HAICO_TEST_ITEM_SECONDS": "0.3"})
    run.wait_for(lambda: campaign.ledger_lines("a") != [], timeout=60, what="a record")
    run.send_signal(signal.SIGUSR1)
    assert run.wait(timeout=60) == 75, run.output()
    done = verdicts(campaign, "a")
    assert 1 <= len(done) < 20 and set(done) == {"completed"}
    assert "haico: not started: SIGUSR1: draining" in run.output()


COLLECTION_GATE = """
import os
import time
from pathlib import Path


def pytest_collection_finish(session):
    Path(os.environ["HAICO_TEST_COLLECTED"]).touch()
    go = Path(os.environ["HAICO_TEST_GO"])
    deadline = time.monotonic() + 60
    while not go.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
"""


def test_usr1_before_the_first_item_runs_nothing_and_exits_75(
    campaign: CampaignProject,
) -> None:
    campaign.arm("a")
    campaign.simple_scripts("s1", "s2", "s3")
    campaign.write("conftest.py", COLLECTION_GATE)
    collected, go = campaign.root / "collected", campaign.root / "go"
    run = campaign.start(env={"HAICO_TEST_COLLECTED": str(collected), "HAICO_TEST_GO": str(go)})
    run.wait_for(collected.exists, timeout=60, what="the end of collection")
    run.send_signal(signal.SIGUSR1)
    run.wait_for(lambda: "SIGUSR1: draining" in run.output(), timeout=60, what="the drain")
    go.touch()
    assert run.wait(timeout=60) == 75, run.output()
    assert campaign.records("a") == []
    assert "3 skipped" in run.output()
