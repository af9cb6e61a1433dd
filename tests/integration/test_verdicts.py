"""Every verdict, produced by a real campaign against the real stand-ins (one arm per case)."""

from __future__ import annotations

import json
import textwrap
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

TEST_MODULE = """
from pytest_haico import Verdict


def test_conversation(haico_conversation):
    assert haico_conversation.verdict is Verdict.COMPLETED, haico_conversation.explain()
"""

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

# arm name -> its arm file; every arm runs every script.
ARMS = {
    "helpful": "[standin]\npersona = 'helpful'\n",
    "looper6": "[agent]\nrecursion_limit = 6\n[standin]\npersona = 'looper'\n",
    "looper7": "[agent]\nrecursion_limit = 7\n[standin]\npersona = 'looper'\n",
    "looper6-noflag": (
        "[agent]\nrecursion_limit = 6\n[standin]\npersona = 'looper'\nrecursion_flag = false\n"
    ),
    "bad_args": "[agent]\nrecursion_limit = 6\n[standin]\npersona = 'bad_args'\n",
    "blank": "[standin]\npersona = 'blank'\n",
    "substituted": "[standin]\npersona = 'helpful'\nsubstitute_model = 'gpt-4o'\n",
    "flaky": "[standin]\npersona = 'flaky'\nseed = 3\n",
    "hang": "[run]\nturn_timeout_s = 2\n[standin]\npersona = 'hang'\n",
    "ratelimited": "[standin]\npersona = 'helpful'\nrate_limit_rpm = 1\n[run]\nconcurrency = 1\n",
}


@pytest.fixture(scope="module")
def campaign(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, dict[str, Any]]]:
    """Run the whole multi-arm campaign once; arm -> script -> its ledger record."""
    import subprocess
    import sys

    root = tmp_path_factory.mktemp("verdicts")
    (root / "pyproject.toml").write_text(
        '[tool.pytest.ini_options]\nasyncio_default_fixture_loop_scope = "function"\n'
    )
    experiments = root / "experiments"
    (experiments / "arms").mkdir(parents=True)
    (experiments / "scripts").mkdir()
    (experiments / "test_conversations.py").write_text(TEST_MODULE)
    (experiments / "scripts" / "cases.yaml").write_text(textwrap.dedent(SCRIPTS))
    for name, text in ARMS.items():
        (experiments / "arms" / f"{name}.toml").write_text(text)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "experiments", "-p", "no:cacheprovider", "-q"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 1, result.stdout + result.stderr  # some items fail, by design
    records: dict[str, dict[str, dict[str, Any]]] = defaultdict(dict)
    for ledger in (root / "results" / "default").glob("*/ledger/*.jsonl"):
        for line in ledger.read_text().splitlines():
            record = json.loads(line)
            records[record["arm"]][record["script"]] = record
    records["_root"] = {"path": {"root": str(root)}}
    return records


def verdicts(campaign: dict[str, dict[str, dict[str, Any]]], arm: str) -> dict[str, str]:
    return {script: record["verdict"] for script, record in campaign[arm].items()}


def test_helpful_completes_and_misses_an_unmet_artifact(campaign: Any) -> None:
    assert verdicts(campaign, "helpful") == {
        "chat": "completed",
        "doc": "completed",
        "nodoc": "expectation_failed",
    }
    assert campaign["helpful"]["chat"]["outcome"] == "passed"
    assert campaign["helpful"]["nodoc"]["outcome"] == "failed"


def test_per_turn_metrics_are_recorded(campaign: Any) -> None:
    turns = campaign["helpful"]["doc"]["turns"]
    assert [t["index"] for t in turns] == [0, 1, 2]
    for turn in turns:
        assert turn["latency_s"] > 0 and turn["first_event_s"] > 0
        assert turn["steps"] >= 1 and turn["tokens_in"] > 0 and turn["tokens_out"] > 0
        assert (turn["provider"], turn["model_id"]) == ("vllm", "helpful")
        assert turn["snapshot_id"]
    assert turns[1]["tool_calls"] >= 1 and turns[1]["tool_errors"] == 0


def test_a_branch_turn_forks_the_thread(campaign: Any) -> None:
    record = campaign["helpful"]["doc"]
    turns = record["turns"]
    assert turns[2]["branch_from"] == 0
    assert turns[2]["thread_id"] != turns[0]["thread_id"] == turns[1]["thread_id"]
    root = Path(campaign["_root"]["path"]["root"])
    transcript = (
        root
        / "results"
        / "default"
        / "helpful"
        / "transcripts"
        / (f"{record['item_id']}.{record['run_id']}.{record['attempt']}.jsonl")
    )
    snapshots = [
        json.loads(line)["snapshot"]
        for line in transcript.read_text().splitlines()
        if json.loads(line)["kind"] == "snapshot"
    ]
    assert snapshots[2]["branch_from"] == 0
    assert snapshots[2]["thread_id"] == turns[2]["thread_id"]


@pytest.mark.parametrize("arm", ["looper6", "looper7", "looper6-noflag"])
def test_a_looping_model_ends_on_the_recursion_limit(campaign: Any, arm: str) -> None:
    assert set(verdicts(campaign, arm).values()) == {"recursion_limit"}
    assert {r["outcome"] for r in campaign[arm].values()} == {"failed"}


def test_bad_tool_arguments_loop_into_the_recursion_limit(campaign: Any) -> None:
    assert set(verdicts(campaign, "bad_args").values()) == {"recursion_limit"}
    assert all(
        any(t["tool_errors"] > 0 for t in record["turns"])
        for record in campaign["bad_args"].values()
    )


def test_blank_answers_are_blank_turns(campaign: Any) -> None:
    assert set(verdicts(campaign, "blank").values()) == {"blank_turn"}


def test_another_model_serving_the_turns_is_substituted(campaign: Any) -> None:
    assert set(verdicts(campaign, "substituted").values()) == {"substituted"}
    assert campaign["substituted"]["chat"]["turns"][0]["model_id"] == "gpt-4o"


def test_a_flaky_model_server_is_an_infra_error(campaign: Any) -> None:
    found = verdicts(campaign, "flaky")
    assert "infra_error" in found.values()
    assert set(found.values()) <= {"infra_error", "completed", "expectation_failed"}
    failed = next(r for r in campaign["flaky"].values() if r["verdict"] == "infra_error")
    assert failed["outcome"] == "error" and failed["error"]["kind"].startswith("backend_")


def test_a_hanging_model_times_out_as_an_infra_error(campaign: Any) -> None:
    assert set(verdicts(campaign, "hang").values()) == {"infra_error"}
    assert {r["error"]["kind"] for r in campaign["hang"].values()} == {"timeout"}


def test_429_is_rate_limited(campaign: Any) -> None:
    found = verdicts(campaign, "ratelimited")
    assert "rate_limited" in found.values()
    limited = next(r for r in campaign["ratelimited"].values() if r["verdict"] == "rate_limited")
    assert limited["outcome"] == "error"
