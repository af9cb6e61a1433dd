"""A run's timeline and the model's sampled utilisation, on the local profile: timeline.json's
phases in order, model-metrics.csv with rows, the summary's lines."""

from __future__ import annotations

import csv
import json

from pytest_haico.ledger.model_metrics import COLUMNS
from tests.harness import CONVERSATION_MODULE, CampaignProject


def test_a_run_writes_its_timeline_in_phase_order_and_samples_the_model(
    campaign: CampaignProject,
) -> None:
    campaign.arm("demo")
    campaign.simple_scripts("s1", "s2", "s3")
    campaign.write("test_conversations.py", CONVERSATION_MODULE)
    result = campaign.run_subprocess()
    assert result.ret == 0, result.stdout.str()
    (run,) = sorted((campaign.arm_dir("demo") / "runs").iterdir())
    doc = json.loads((run / "timeline.json").read_text())
    assert (doc["schema"], doc["arm"], doc["exit"]["code"]) == (1, "demo", 0)
    phases = doc["phases"]
    assert {"llm", "backend"} <= set(phases["stack"]["services"])
    order = [
        doc["process_started_at"],
        phases["static_gates"]["start"],
        phases["static_gates"]["end"],
        phases["stack"]["start"],
        phases["stack"]["end"],
        phases["dynamic_gates"]["start"],
        phases["dynamic_gates"]["end"],
        phases["conversing"]["first_start"],
        phases["conversing"]["last_end"],
        phases["final_dump"]["start"],
        phases["final_dump"]["end"],
        phases["stop"]["start"],
        phases["stop"]["end"],
        doc["exit"]["at"],
    ]
    assert order == sorted(order)
    assert phases["drain"]["cause"] == "stopped"
    with (run / "model-metrics.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert rows and tuple(rows[0]) == COLUMNS
    assert all(row["running"] != "" for row in rows)
    # Only the samples while the conversations ran are judged.
    assert doc["model"]["samples"] <= len(rows)
    result.stdout.fnmatch_lines(
        ["*allocation *: starting *%, conversing *%, draining *%, dumping *%"]
    )


def test_concurrency_auto_records_its_adaptations_and_runs_every_item(
    campaign: CampaignProject,
) -> None:
    # One sequence at a time at the stand-in and 300 ms a reply: the 8 conversations take
    # 2.4 s of the model at least, so samples (1 s apart) find items queued.
    campaign.arm(
        "demo",
        '[run]\nconcurrency = "auto"\nmax_concurrency = 4\n'
        "[standin]\nlatency_ms = 300\nmax_num_seqs = 1\n",
    )
    campaign.simple_scripts(*(f"s{i}" for i in range(8)))
    campaign.write("test_conversations.py", CONVERSATION_MODULE)
    result = campaign.run_subprocess()
    assert result.ret == 0, result.stdout.str()
    result.assert_outcomes(passed=8)
    assert len(campaign.records("demo")) == 8
    (run,) = sorted((campaign.arm_dir("demo") / "runs").iterdir())
    timeline = json.loads((run / "timeline.json").read_text())["concurrency"]
    config = json.loads((run / "run-config.json").read_text())
    assert config["concurrency"] == timeline
    assert config["values"]["ARM_RUN_CONCURRENCY"] == "auto"
    assert (timeline["mode"], timeline["bounds"], timeline["initial"]) == ("auto", [1, 4], 1)
    first, *_ = timeline["adaptations"]  # the first sample with items queued: 1 → 2
    assert (first["old"], first["new"]) == (1, 2)
    assert first["reason"].startswith("model has room")
    count = len(timeline["adaptations"])
    result.stdout.fnmatch_lines(
        [f"*concurrency auto: 1→{timeline['final']} (bounds 1 to 4), {count} adaptation*"]
    )


def test_a_fixed_concurrency_is_recorded_as_such(campaign: CampaignProject) -> None:
    campaign.arm("demo", "[run]\nconcurrency = 2\n")
    campaign.simple_scripts("s1")
    campaign.write("test_conversations.py", CONVERSATION_MODULE)
    result = campaign.run_subprocess("--haico-concurrency", "3")
    assert result.ret == 0, result.stdout.str()
    (run,) = sorted((campaign.arm_dir("demo") / "runs").iterdir())
    doc = json.loads((run / "timeline.json").read_text())
    assert doc["concurrency"] == {"mode": "fixed", "limit": 3}
    assert "concurrency auto" not in result.stdout.str()
