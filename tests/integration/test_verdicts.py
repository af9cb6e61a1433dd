"""Every verdict, produced by a real campaign against the real stand-ins (one arm per case)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.harness import CONVERSATION_MODULE, CampaignProject

Records = dict[str, dict[str, dict[str, Any]]]

SCRIPTS = """
- id: chat
  turns:
    - user: "Hello, who are you?"
- id: doc
  turns:
    - user: "Plan a day in Porto."
    - user: "Write it up as a document."
      expect: {artifact: true}
    - user: "Instead, plan it for a rainy day."
      branch_from: 0
- id: nodoc
  turns:
    - user: "Tell me a joke."
      expect: {artifact: true}
"""

# arm name -> its arm file; every arm runs every script, and passes the gates (a backend that
# records another model for every turn fails the canary gate before any item: that
# `substituted` is in test_gates_in_a_run).
ARMS = {
    "helpful": "[standin]\npersona = 'helpful'\n",
    "looper6": "[agent]\nrecursion_limit = 6\n[standin]\npersona = 'looper'\n",
    "looper7": "[agent]\nrecursion_limit = 7\n[standin]\npersona = 'looper'\n",
    "looper6-noflag": (
        "[agent]\nrecursion_limit = 6\n[standin]\npersona = 'looper'\nrecursion_flag = false\n"
    ),
    "bad_args": "[agent]\nrecursion_limit = 6\n[standin]\npersona = 'bad_args'\n",
    "blank": "[standin]\npersona = 'blank'\n",
    "flaky": "[standin]\npersona = 'flaky'\nseed = 3\n",
    "hang": "[run]\nturn_timeout_s = 2\n[standin]\npersona = 'hang'\n",
    "ratelimited": "[standin]\npersona = 'helpful'\nrate_limit_rpm = 1\n[run]\nconcurrency = 1\n",
}


@dataclass
class VerdictRun:
    """The one run of the whole multi-arm campaign, and the records it left."""

    result: pytest.RunResult
    records: Records  # arm -> script -> its ledger record
    results: Path  # results/default


@pytest.fixture(scope="module")
def _verdict_runs() -> list[VerdictRun]:
    """Holds the campaign's one run, made by the first test that asks for it."""
    return []


@pytest.fixture
def verdict_run(_verdict_runs: list[VerdictRun], campaign: CampaignProject) -> VerdictRun:
    """Run the whole multi-arm campaign once per module (in the first test's project)."""
    if not _verdict_runs:
        campaign.write("test_conversations.py", CONVERSATION_MODULE)
        campaign.scripts("cases.yaml", SCRIPTS)
        for name, text in ARMS.items():
            campaign.arm(name, text)
        result = campaign.run_subprocess("-q", timeout=600)
        records = {arm: {r["script"]: r for r in campaign.records(arm)} for arm in ARMS}
        _verdict_runs.append(VerdictRun(result, records, campaign.root / "results" / "default"))
    (run,) = _verdict_runs
    # Some items fail, by design.
    assert run.result.ret == 1, run.result.stdout.str() + run.result.stderr.str()
    return run


@pytest.fixture
def records(verdict_run: VerdictRun) -> Records:
    """arm -> script -> its ledger record, from the campaign's one run."""
    return verdict_run.records


def verdicts(records: Records, arm: str) -> dict[str, str]:
    return {script: record["verdict"] for script, record in records[arm].items()}


def test_helpful_completes_and_misses_an_unmet_artifact(records: Records) -> None:
    assert verdicts(records, "helpful") == {
        "chat": "completed",
        "doc": "completed",
        "nodoc": "expectation_failed",
    }
    assert records["helpful"]["chat"]["outcome"] == "passed"
    assert records["helpful"]["nodoc"]["outcome"] == "failed"


def test_per_turn_metrics_are_recorded(records: Records) -> None:
    turns = records["helpful"]["doc"]["turns"]
    assert [t["index"] for t in turns] == [0, 1, 2]
    for turn in turns:
        assert turn["latency_s"] > 0 and turn["first_event_s"] > 0
        assert turn["steps"] >= 1 and turn["tokens_in"] > 0 and turn["tokens_out"] > 0
        assert (turn["provider"], turn["model_id"]) == ("vllm", "helpful")
        assert turn["snapshot_id"]
    assert turns[1]["tool_calls"] >= 1 and turns[1]["tool_errors"] == 0


def test_a_branch_turn_forks_the_thread(verdict_run: VerdictRun) -> None:
    record = verdict_run.records["helpful"]["doc"]
    turns = record["turns"]
    assert turns[2]["branch_from"] == 0
    assert turns[2]["thread_id"] != turns[0]["thread_id"] == turns[1]["thread_id"]
    transcript = (
        verdict_run.results
        / "helpful"
        / "transcripts"
        / (f"{record['item_id']}.{record['run_id']}.{record['attempt']}.jsonl")
    )
    header, *events = [json.loads(line) for line in transcript.read_text().splitlines()]
    assert header == {
        "haico_transcript": 1,
        "item_id": record["item_id"],
        "run_id": record["run_id"],
        "attempt": record["attempt"],
        "arm": "helpful",
        "script": "doc",
        "repeat": 0,
        "nodeid": record["nodeid"],
        "thread_id": turns[0]["thread_id"],
        "started_at": header["started_at"],
    }
    snapshots = [event["snapshot"] for event in events if event["kind"] == "snapshot"]
    assert snapshots[2]["branch_from"] == 0
    assert snapshots[2]["thread_id"] == turns[2]["thread_id"]


@pytest.mark.parametrize("arm", ["looper6", "looper7", "looper6-noflag"])
def test_a_looping_model_ends_on_the_recursion_limit(records: Records, arm: str) -> None:
    assert set(verdicts(records, arm).values()) == {"recursion_limit"}
    assert {r["outcome"] for r in records[arm].values()} == {"failed"}


def test_bad_tool_arguments_loop_into_the_recursion_limit(records: Records) -> None:
    assert set(verdicts(records, "bad_args").values()) == {"recursion_limit"}
    assert all(
        any(t["tool_errors"] > 0 for t in record["turns"])
        for record in records["bad_args"].values()
    )


def test_blank_answers_are_blank_turns(records: Records) -> None:
    assert set(verdicts(records, "blank").values()) == {"blank_turn"}


def test_a_flaky_model_server_is_an_infra_error(records: Records) -> None:
    found = verdicts(records, "flaky")
    assert "infra_error" in found.values()
    assert set(found.values()) <= {"infra_error", "completed", "expectation_failed"}
    failed = next(r for r in records["flaky"].values() if r["verdict"] == "infra_error")
    assert failed["outcome"] == "error" and failed["error"]["kind"].startswith("backend_")


def test_a_model_that_hangs_once_the_conversation_goes_on_times_out_as_an_infra_error(
    records: Records,
) -> None:
    # Persona hang answers a conversation's first model call and holds the next one: the
    # one-call turns end, the conversation that goes on times out at its second turn.
    assert verdicts(records, "hang") == {
        "chat": "completed",
        "doc": "infra_error",
        "nodoc": "expectation_failed",
    }
    doc = records["hang"]["doc"]
    assert doc["error"]["kind"] == "timeout"
    # The first turn ended (a latency) and did not time out: a timeout ends the conversation.
    assert len(doc["turns"]) == 2 and doc["turns"][0]["latency_s"] is not None


def test_429_is_rate_limited(records: Records) -> None:
    found = verdicts(records, "ratelimited")
    assert "rate_limited" in found.values()
    limited = next(r for r in records["ratelimited"].values() if r["verdict"] == "rate_limited")
    assert limited["outcome"] == "error"
