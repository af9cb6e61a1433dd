"""The preflight gates in a real run: gates.json in every run directory; a failed gate exits
78 before the arm's first item, records nothing and leaves nothing running; and
--haico-gates-only, which runs the gates of every selected arm and no item."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pytest_haico.ledger.item_times import ItemTimes
from pytest_haico.ledger.layout import ArmPaths
from pytest_haico.procfs import is_alive
from pytest_haico.runner.preflight import MIN_DUMP_SPACE, dump_space_needed, slowest_item
from tests.harness import CONVERSATION_MODULE, CampaignProject

STATIC = [
    "prohibited_environment",
    "login_node",
    "tool_calling_flags",
    "parallel_width",
    "one_node",
    "vllm_environment",
    "inputs_present",
    "results_writable",
    "node_tmpdir",
    "walltime",
    "output_collision",
]
DYNAMIC = [
    "served_model",
    "max_model_len",
    "completion",
    "api_key",
    "tool_choice_auto",
    "tool_call_structure",
    "backend_health",
    "canary_turn",
]
# Stand-in personas that pass the gates although their conversations fail: a model that
# loops, one that answers nothing, one that hangs once a conversation goes on. (The one
# session of test_verdicts passes the gates of every other persona but dead, which dies at
# its first request.)
PERSONAS = ["blank", "hang", "looper"]
BRIEF = "(why and the fix: the haico summary)"
TOOLS_FIX = (
    "set [vllm] enable_tool_calling = true and tool_call_parser = 'hermes' in arms/demo.toml "
    "(vLLM gets --enable-auto-tool-choice --tool-call-parser hermes); a server started by hand "
    "needs those flags. Never run the arm without them: the backend's agent sends tools with "
    "tool_choice omitted ('auto'), so every turn would fail"
)


def literal(text: str) -> str:
    """`text` as an fnmatch pattern that matches it alone (``[vllm]`` is no character class)."""
    return text.replace("[", "[[]")


def run_dirs(campaign: CampaignProject, arm: str = "demo") -> list[Path]:
    runs = campaign.arm_dir(arm) / "runs"
    return sorted(runs.iterdir()) if runs.is_dir() else []


def gates_json(run: Path) -> dict[str, Any]:
    document: dict[str, Any] = json.loads((run / "gates.json").read_text())
    return document


def gate_names(document: dict[str, Any]) -> list[str]:
    return [gate["name"] for gate in document["gates"]]


def services_alive(run: Path) -> list[dict[str, Any]]:
    registry = json.loads((run / "services.json").read_text())
    return [s for s in registry["services"] if s.get("pid") and is_alive(s["pid"])]


def conversations(campaign: CampaignProject, *scripts: str) -> None:
    campaign.simple_scripts(*scripts)
    campaign.write("test_conversations.py", CONVERSATION_MODULE)


def test_a_run_writes_gates_json_with_every_gate_passed_and_the_canary_transcript(
    campaign: CampaignProject,
) -> None:
    campaign.arm("demo")
    conversations(campaign, "s1", "s2")
    result = campaign.run_subprocess()
    assert result.ret == 0, result.stdout.str()
    assert [r["verdict"] for r in campaign.records("demo")] == ["completed", "completed"]
    (run,) = run_dirs(campaign)
    document = gates_json(run)
    assert (document["schema"], document["passed"], document["failed_gate"]) == (1, True, None)
    assert gate_names(document) == STATIC + DYNAMIC
    assert all(gate["passed"] and gate["detail"] for gate in document["gates"])
    assert (run / "gates.json").stat().st_mode & 0o777 == 0o640
    header, *canary = [
        json.loads(line) for line in (run / "canary.1.jsonl").read_text().splitlines()
    ]
    assert header == {
        "haico_transcript": 1,
        "canary": 1,
        "arm": "demo",
        "thread_id": canary[0]["body"]["thread_id"],
    }
    assert canary[0]["kind"] == "request"
    assert "Canary 1: reply with one word." in json.dumps(canary[0])
    # The canary is no item: nothing of it is in the ledger or among the transcripts.
    assert len(list((campaign.arm_dir("demo") / "transcripts").iterdir())) == 2


@pytest.mark.parametrize("mode", ["strict", "campaign"])
def test_a_failed_static_gate_exits_78_before_any_service_starts(
    campaign: CampaignProject, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    campaign.arm("demo")
    conversations(campaign, "s1", "s2")
    monkeypatch.setenv("OPENAI_ENDPOINT_URL", "https://api.openai.com/v1")
    result = campaign.run("--haico-exit", mode)
    assert result.ret == 78, result.stdout.str()
    sentence = (
        "gate prohibited_environment failed: OPENAI_ENDPOINT_URL is set "
        "('https://api.openai.com/v1'): the backend would send the conversations to that "
        "endpoint instead of the arm's vLLM; unset it (`unset OPENAI_ENDPOINT_URL`, and remove "
        "it from the job script, ~/.bashrc or the module that sets it), then rerun"
    )
    result.stdout.fnmatch_lines(
        [
            "*= haico =*",
            f"gate failed (exit 78): arm demo: {sentence}",
            f"! haico: arm demo: gate prohibited_environment failed {BRIEF} !",
        ]
    )
    output = result.stdout.str() + result.stderr.str()
    assert output.count("OPENAI_ENDPOINT_URL is set") == 1, output  # once, in the summary
    assert campaign.records("demo") == []
    result.assert_outcomes()  # before the first item: no item ran, none errored
    (run,) = run_dirs(campaign)
    assert not (run / "services.json").exists()
    assert list((run / "logs").iterdir()) == []  # made by the claim; no service wrote a log
    document = gates_json(run)
    assert (document["passed"], document["failed_gate"]) == (False, "prohibited_environment")
    assert gate_names(document) == ["prohibited_environment"]


# name -> (arm file, exit mode, the failed gate, its failure line): a 78 in either mode.
DYNAMIC_FAILURES = {
    "no-tool-flags": (
        "[vllm]\nenable_tool_calling = false\n",
        "strict",
        "tool_choice_auto",
        "gate tool_choice_auto failed: the model server refuses tool calls as the backend "
        f"sends them: HTTP 400: *--enable-auto-tool-choice*; {literal(TOOLS_FIX)}",
    ),
    "another-model": (
        "[standin]\nsubstitute_model = 'gpt-4o'\n",
        "campaign",
        "canary_turn",
        "gate canary_turn failed: the canary turn was served by provider 'vllm', model "
        "'gpt-4o'; the arm expects 'vllm', 'demo'; the backend did not use the arm's model: "
        "check its configuration (no OPENAI_ENDPOINT_URL, an endpoint host containing 'vllm', "
        "the image or --haico-backend-cmd in use)",
    ),
    "dead-engine": (
        "[standin]\npersona = 'dead'\n",
        "campaign",
        "completion",
        "gate completion failed: a one-token completion: POST http://127.0.0.1:*/v1/chat/"
        "completions: ConnectError: * (after * retr*: HTTP 500*); check the model server's "
        "log (runs/<run_id>/logs/): it may have died or be loading still; a GPU fault keeps "
        "/health at 200 — resubmit to get another node",
    ),
}


@pytest.mark.parametrize("case", sorted(DYNAMIC_FAILURES))
def test_a_failed_dynamic_gate_exits_78_records_nothing_and_leaves_nothing_running(
    campaign: CampaignProject, case: str
) -> None:
    arm, mode, gate, line = DYNAMIC_FAILURES[case]
    campaign.arm("demo", arm)
    conversations(campaign, "s1", "s2", "s3")
    result = campaign.run_subprocess("--haico-exit", mode, "-v", "--haico-progress=lines")
    assert result.ret == 78, result.stdout.str()
    result.stdout.fnmatch_lines(["*= haico =*", f"gate failed (exit 78): arm demo: {line}"])
    # The whole sentence once, in the summary: the item's error, the short summary and
    # pytest's stop line name the gate only.
    output = result.stdout.str() + result.stderr.str()
    assert output.count(f"gate {gate} failed: ") == 1, output
    result.stdout.fnmatch_lines(
        [
            f"*StackError: arm demo: gate {gate} failed {BRIEF}",
            "ERROR *test_conversation[[]demo-s1-r0] - *",
            f"*Interrupted: haico: arm demo: gate {gate} failed {BRIEF}*",
        ],
        consecutive=False,
    )
    assert "PASSED" not in result.stdout.str()
    assert campaign.records("demo") == []
    transcripts = campaign.arm_dir("demo") / "transcripts"
    assert not transcripts.is_dir() or list(transcripts.iterdir()) == []
    (run,) = run_dirs(campaign)
    assert services_alive(run) == []
    assert not (run / "dumps").exists()
    document = gates_json(run)
    assert document["failed_gate"] == gate
    names = gate_names(document)
    assert names == (STATIC + DYNAMIC)[: len(names)] and names[-1] == gate
    assert [g["passed"] for g in document["gates"]] == [True] * (len(names) - 1) + [False]


def test_gates_only_passes_weak_personas_prints_the_tables_and_runs_no_item(
    campaign: CampaignProject,
) -> None:
    for persona in PERSONAS:
        campaign.arm(persona, f"[standin]\npersona = '{persona}'\n")
    conversations(campaign, "s1", "s2")
    result = campaign.run_subprocess("--haico-gates-only", timeout=600)
    assert result.ret == 0, result.stdout.str()
    arms = ", ".join(sorted(PERSONAS))
    items = 2 * len(PERSONAS)
    result.stdout.fnmatch_lines(
        [
            f"collected {items} items / {items} deselected / 0 selected",
            f"haico: --haico-gates-only: the gates of arm(s) {arms}; no item runs "
            f"({items} deselected)",
            "*= haico =*",
        ]
    )
    for persona in sorted(PERSONAS):
        (run,) = run_dirs(campaign, persona)
        result.stdout.fnmatch_lines(
            [
                f"gates of arm {persona}: all 19 passed ({run / 'gates.json'})",
                "  gate                    result  seconds  detail",
                "  prohibited_environment  ok *",
                "  canary_turn             ok * served by 'vllm', '*'*",
            ]
        )
        assert gates_json(run)["passed"] is True
        assert services_alive(run) == []
        assert not (run / "dumps").exists() and not (run / "run-config.json").exists()
        assert campaign.records(persona) == []
    result.stdout.fnmatch_lines([f"*= {items} deselected in *"])


def test_gates_only_with_a_failed_gate_prints_every_arms_table_and_exits_78(
    campaign: CampaignProject,
) -> None:
    campaign.arm("demo", "[vllm]\nenable_tool_calling = false\n")
    campaign.arm("good")
    conversations(campaign, "s1")
    result = campaign.run_subprocess("--haico-gates-only", "--haico-exit", "campaign")
    assert result.ret == 78, result.stdout.str()
    (failed,) = run_dirs(campaign, "demo")
    (passed,) = run_dirs(campaign, "good")
    result.stdout.fnmatch_lines(
        [
            "*= haico =*",
            f"gates of arm demo: gate tool_choice_auto FAILED ({failed / 'gates.json'})",
            "  gate                    result  seconds  detail",
            "  tool_calling_flags      ok * tool calling is off in the arm: the "
            "tool-capability probe decides after the start",
            "  tool_choice_auto        FAILED * the model server refuses tool calls as the "
            "backend sends them: HTTP 400: *",
            f"  fix (tool_choice_auto): {literal(TOOLS_FIX)}",
            f"gates of arm good: all 19 passed ({passed / 'gates.json'})",
            "gate failed (exit 78): arm demo: gate tool_choice_auto failed: *",
        ]
    )
    assert "tool_call_structure" not in result.stdout.str().split("gates of arm good")[0]
    for arm in ("demo", "good"):
        assert campaign.records(arm) == []
        (run,) = run_dirs(campaign, arm)
        assert services_alive(run) == []


def test_the_walltime_gate_is_given_the_stratum_whose_slowest_item_is_quickest() -> None:
    times = ItemTimes()
    for stratum, seconds in [("long", 900.0), ("long", 1200.0), ("short", 30.0), ("short", 60.0)]:
        assert times.observe(stratum, "completed", seconds)
    # A run that can finish one item is worth starting; admission keeps the long ones out.
    assert slowest_item(times, ["long", "short", "new"]) == (60.0, "short")
    assert slowest_item(times, ["new", "other"]) == (None, "new, other")


def test_the_space_asked_for_the_dumps_grows_with_the_arms_earlier_dumps(tmp_path: Path) -> None:
    paths = ArmPaths(tmp_path / "demo")
    assert dump_space_needed(paths) == MIN_DUMP_SPACE
    dumps = paths.runs_dir / "local-1.1" / "dumps"
    dumps.mkdir(parents=True)
    with open(dumps / "final-20260101T000000Z.dump", "wb") as dump:
        dump.truncate(100 * 1024 * 1024)  # sparse: the size is what counts
    # A periodic dump, the one replacing it and the final one can exist at once.
    assert dump_space_needed(paths) == 3 * 100 * 1024 * 1024
