"""A job of `haico submit` runs the inputs the submission froze, or nothing: with
$HAICO_INPUTS_DIGEST set, gate inputs_present compares it with the experiments and
cluster.env the run reads, and an edit made since exits 78 before anything starts."""

from __future__ import annotations

import json
from typing import Any

import pytest

from pytest_haico.config.frozen import INPUTS_DIGEST_ENV, inputs_digest
from tests.harness import CONVERSATION_MODULE, CampaignProject

FIX = (
    "the frozen inputs of this submission were edited after `haico submit`: restore them, "
    "or submit again (a new submission) to run the edit"
)


def frozen_campaign(campaign: CampaignProject) -> str:
    """The demo arm with two conversations, and the digest of its inputs as they are now."""
    campaign.arm("demo")
    campaign.simple_scripts("s1", "s2")
    campaign.write("test_conversations.py", CONVERSATION_MODULE)
    return inputs_digest(campaign.experiments, None)


def gates_json(campaign: CampaignProject) -> dict[str, Any]:
    (run,) = sorted((campaign.arm_dir("demo") / "runs").iterdir())
    document: dict[str, Any] = json.loads((run / "gates.json").read_text())
    return document


def test_a_run_of_the_frozen_inputs_passes_the_gate_and_runs(
    campaign: CampaignProject, monkeypatch: pytest.MonkeyPatch
) -> None:
    digest = frozen_campaign(campaign)
    monkeypatch.setenv(INPUTS_DIGEST_ENV, digest)
    result = campaign.run_subprocess("--haico-exit", "campaign")
    assert result.ret == 0, result.stdout.str()
    assert [r["verdict"] for r in campaign.records("demo")] == ["completed", "completed"]
    (gate,) = [g for g in gates_json(campaign)["gates"] if g["name"] == "inputs_present"]
    assert gate["passed"]
    assert gate["detail"].endswith(f"; the frozen inputs of the submission ({digest[:19]})")


@pytest.mark.parametrize("mode", ["strict", "campaign"])
def test_an_input_edited_after_the_digest_exits_78_before_any_item(
    campaign: CampaignProject, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    submitted = frozen_campaign(campaign)
    campaign.simple_scripts("s1", "s2", text="edited")  # after `haico submit`
    edited = inputs_digest(campaign.experiments, None)
    monkeypatch.setenv(INPUTS_DIGEST_ENV, submitted)
    result = campaign.run("--haico-exit", mode)
    assert result.ret == 78, result.stdout.str()
    result.stdout.fnmatch_lines(
        [
            "*= haico =*",
            f"gate failed (exit 78): arm demo: gate inputs_present failed: the inputs "
            f"{campaign.experiments} digest to {edited[:19]}, not to {submitted[:19]} "
            f"($HAICO_INPUTS_DIGEST, taken at submission); {FIX}",
        ]
    )
    result.assert_outcomes()  # before the first item: no item ran, none errored
    assert campaign.records("demo") == []
    document = gates_json(campaign)
    assert (document["passed"], document["failed_gate"]) == (False, "inputs_present")


def test_a_malformed_digest_exits_78_with_its_own_fix(
    campaign: CampaignProject, monkeypatch: pytest.MonkeyPatch
) -> None:
    frozen_campaign(campaign)
    monkeypatch.setenv(INPUTS_DIGEST_ENV, "abc123")
    result = campaign.run("--haico-exit", "campaign")
    assert result.ret == 78, result.stdout.str()
    result.stdout.fnmatch_lines(
        [
            "gate failed (exit 78): arm demo: gate inputs_present failed: "
            "HAICO_INPUTS_DIGEST='abc123' is not a digest of frozen inputs (sha256: and 64 "
            "lower-case hex digits); `haico submit` sets HAICO_INPUTS_DIGEST for the jobs it "
            "submits: submit again, or unset it to run these inputs without the check",
        ]
    )
    result.assert_outcomes()
    assert campaign.records("demo") == []
