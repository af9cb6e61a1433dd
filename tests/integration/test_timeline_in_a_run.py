"""A run's timeline and the model's sampled utilisation, on the local profile: timeline.json's
phases in order, model-metrics.csv with rows, the summary's lines."""

from __future__ import annotations

import csv
import json

from pytest_haico.runner.model_metrics import COLUMNS
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
    assert doc["model"]["samples"] == len(rows)
    result.stdout.fnmatch_lines(
        ["*allocation *: starting *%, conversing *%, draining *%, dumping *%"]
    )
