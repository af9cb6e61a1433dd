"""The decision table of `haico continue`, row by row: what becomes of a share by how its
newest attempt ended and what the ledgers say it owes."""

from __future__ import annotations

import pytest

from pytest_haico.gates.backend import CANARY_TURN
from pytest_haico.gates.static import WALLTIME
from pytest_haico.slurm.records import LAUNCH_HELD, TaskState
from pytest_haico.submit.decisions import (
    LAST_GATE,
    WALLTIME_GATE,
    Action,
    Decision,
    Dependency,
    Evidence,
    GateFailure,
    Rules,
    RunGates,
    decide,
    had_its_chance,
)

RULES = Rules()


def _decide(end: str | None, *, owed: int = 3, **evidence: object) -> tuple[Action, str]:
    state = None
    if end is not None:
        word, _, code = end.partition(" ")
        state = TaskState(word, code)
    decision = decide(Evidence(end=state, owed=owed, log="job.log", **evidence), RULES)  # type: ignore[arg-type]
    return decision.action, decision.reason


@pytest.mark.parametrize(
    ("end", "why"),
    [
        ("FAILED 75:0", "exit 75: drained, or items owed a retry"),
        ("TIMEOUT 0:0", "out of walltime"),
        ("TIMEOUT 75:0", "out of walltime"),
        ("PREEMPTED 0:0", "preempted"),
        ("NODE_FAIL 0:0", "its node failed"),
        ("BOOT_FAIL 0:0", "its node failed to boot"),
        ("FAILED 0:9", "killed by SIGKILL"),
        ("FAILED 0:15", "killed by SIGTERM"),
        ("FAILED 137:0", "exit 137: its pytest was killed by SIGKILL"),
        ("FAILED 143:0", "exit 143: its pytest was killed by SIGTERM"),
    ],
)
def test_the_infrastructure_cutting_a_share_short_reruns_what_it_owes(end: str, why: str) -> None:
    assert _decide(end) == (Action.RERUN, why)


def test_the_walltime_gates_refusal_is_a_cost_shortfall_and_reruns_any_other_gate_is_terminal() -> (
    None
):
    assert WALLTIME_GATE == WALLTIME
    walltime = GateFailure(WALLTIME, "1 min left, an item takes 5 min", "ask for more --time")
    assert _decide("FAILED 78:0", gate=walltime) == (
        Action.RERUN,
        "the walltime gate: less time left than an item costs",
    )
    venv = GateFailure("vllm_environment", "no vllm in /venv", "set VLLM_VENV in cluster.env")
    assert _decide("FAILED 78:0", gate=venv) == (
        Action.STOP,
        "gate vllm_environment failed: no vllm in /venv; set VLLM_VENV in cluster.env",
    )
    action, why = _decide("FAILED 78:0")
    assert action is Action.STOP and "the stack failed before the first item" in why


def test_a_cancelled_share_is_held_naming_the_option_that_reruns_it() -> None:
    assert _decide("CANCELLED 0:15", owed=2) == (
        Action.HOLD,
        "cancelled (scancel), not rerun: --include-cancelled reruns its 2 owed items",
    )
    decision = decide(
        Evidence(end=TaskState("CANCELLED", "0:15"), owed=2), Rules(include_cancelled=True)
    )
    assert decision == Decision(Action.RERUN, "cancelled, and --include-cancelled reruns it")


def test_a_share_slurm_cancelled_for_a_failed_dependency_waits_for_it_then_reruns() -> None:
    waiting = Dependency(done=False, detail="the 1 owing smoke share(s) are")
    action, why = _decide("CANCELLED 0:0", dependency=waiting)
    assert action is Action.WAIT
    assert why.endswith("it runs again once the 1 owing smoke share(s) are done")
    action, why = _decide("CANCELLED 0:0", dependency=Dependency(True, "the smoke shares are"))
    assert action is Action.RERUN and "(the smoke shares are done now)" in why


@pytest.mark.parametrize(
    ("end", "action", "start"),
    [
        ("FAILED 4:0", Action.STOP, "a usage error (exit 4): read its log job.log"),
        ("COMPLETED 0:0", Action.STOP, "inconsistent: it ended COMPLETED, yet 3 of its items"),
        ("OUT_OF_MEMORY 0:125", Action.STOP, "out of memory: raise the arm's [slurm] mem"),
        ("FAILED 1:0", Action.STOP, "ended FAILED 1:0, which no rule reruns"),
        (None, Action.STOP, "Slurm keeps no record of how it ended"),
    ],
)
def test_terminal_ends_say_what_to_do(end: str | None, action: Action, start: str) -> None:
    got, why = _decide(end)
    assert got is action and why.startswith(start), why


@pytest.mark.parametrize("end", ["PENDING 0:0", "RUNNING 0:0", "COMPLETING 0:0"])
def test_a_pending_or_running_share_is_never_resubmitted_even_owing_everything(end: str) -> None:
    action, why = _decide(end, owed=6)
    assert action is Action.WAIT and why.endswith(", not resubmitted")


@pytest.mark.parametrize("end", ["COMPLETED 0:0", "TIMEOUT 0:0", "CANCELLED 0:15", "FAILED 78:0"])
def test_a_share_that_owes_nothing_is_done_however_it_ended(end: str) -> None:
    assert _decide(end, owed=0) == (Action.DONE, "done")


def test_a_share_stops_after_max_rounds_attempts_in_a_row_that_had_their_chance() -> None:
    assert _decide("TIMEOUT 0:0", stalled=4)[0] is Action.RERUN
    action, why = _decide("TIMEOUT 0:0", stalled=5)
    assert action is Action.STOP
    assert why.startswith(
        "out of walltime, but its last 5 attempts in a row that had their chance (their "
        "walltime, or their stack up) recorded no item"
    )
    assert "--max-rounds 5" in why


@pytest.mark.parametrize(
    ("end", "gates", "counts"),
    [
        ("TIMEOUT 0:0", None, True),  # its own walltime ran out, however far it got
        ("FAILED 75:0", RunGates(None, frozenset({"one_node", LAST_GATE})), True),
        ("FAILED 78:0", RunGates(GateFailure(WALLTIME, "1 min left", "")), True),
        ("FAILED 75:0", None, False),  # killed before its first gate
        ("FAILED 75:0", RunGates(None, frozenset({"one_node", "walltime"})), False),
        ("FAILED 0:9", RunGates(None, frozenset({"one_node"})), False),
        ("PREEMPTED 0:0", None, False),
        ("CANCELLED 0:0", None, False),  # Slurm cancelled it before it started
    ],
)
def test_only_attempts_that_had_their_chance_count_against_max_rounds(
    end: str, gates: RunGates | None, counts: bool
) -> None:
    assert LAST_GATE == CANARY_TURN
    word, _, code = end.partition(" ")
    assert had_its_chance(TaskState(word, code), gates) is counts


def test_a_gate_that_passed_for_the_arm_on_other_nodes_is_the_node_and_is_rerun() -> None:
    gate = GateFailure("canary_turn", "no answer", "")
    evidence = Evidence(
        end=TaskState("FAILED", "78:0"), owed=3, gate=gate, node="hn2", gate_passed_on="hn1"
    )
    decision = decide(evidence, Rules())
    assert decision.action is Action.RERUN
    assert decision.reason == (
        "gate canary_turn failed on node hn2, and passed for this arm on hn1: the node, not "
        "the campaign"
    )
    alone = decide(Evidence(end=TaskState("FAILED", "78:0"), owed=3, gate=gate), Rules())
    assert alone.action is Action.STOP


def test_a_task_slurm_holds_after_its_launch_failed_is_rerun_and_any_other_pending_waits() -> None:
    """A network cut left the node's run behind; the requeued task's launch failed there
    ("Duplicate jobid") and Slurm holds it, priority 0, until a person releases it."""
    held = TaskState("PENDING", "0:0", "node2", LAUNCH_HELD)
    decision = decide(Evidence(end=held, owed=3, log="job.log"), RULES)
    assert decision == Decision(
        Action.RERUN,
        "held by Slurm, its launch failed on node2 (launch_failed_requeued_held): it never "
        "starts by itself, so it is cancelled and rerun",
    )
    assert TaskState.from_text(held.text, "node2") == held
    assert decide(Evidence(end=held, owed=0), RULES) == Decision(Action.DONE, "done")
    assert _decide("PENDING 0:0") == (Action.WAIT, "pending, not resubmitted")
