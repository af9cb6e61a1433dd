"""Blaming nodes: `pytest_haico.submit.nodes` on placements made by hand."""

from __future__ import annotations

from pytest_haico.submit.nodes import Exclusions, Placement, blame, gate_passed_elsewhere


def _failed(attempt: str, node: str, how: str = "NODE_FAIL") -> Placement:
    return Placement(arm="a", attempt=attempt, node=node, failure=how)


def _fruitful(attempt: str, node: str, arm: str = "a") -> Placement:
    return Placement(arm=arm, attempt=attempt, node=node, fruitful=True)


def test_a_node_is_blamed_after_two_failed_attempts_while_the_arm_records_items_elsewhere() -> None:
    placements = [
        _failed("1_0", "n2"),
        _failed("1_1.1", "n2", "3 of its 3"),
        _fruitful("1_2.1", "n1"),
    ]
    [found] = blame(placements).values()
    assert found.node == "n2"
    assert found.failures == ("1_0: NODE_FAIL", "1_1.1: 3 of its 3")
    assert found.elsewhere == 1


def test_one_failed_attempt_blames_no_node() -> None:
    assert blame([_failed("1_0", "n2"), _fruitful("1_2.1", "n1")]) == {}


def test_two_runs_of_one_attempt_count_once_per_attempt_id() -> None:
    assert blame([_failed("1_0", "n2"), _failed("1_0", "n2"), _fruitful("1_2.1", "n1")]) == {}


def test_no_node_is_blamed_when_nothing_recorded_items_anywhere_else() -> None:
    # Failing everywhere is the campaign (or the arm), not a node.
    placements = [_failed("1_0", "n2"), _failed("1_1", "n2"), _fruitful("1_3.1", "n1", arm="b")]
    assert blame(placements) == {}


def test_a_gate_passed_elsewhere_names_the_other_nodes_of_the_same_arm() -> None:
    failed = Placement(arm="a", attempt="1_0.1", node="n2", failed_gate="canary_turn")
    others = [
        Placement(arm="a", attempt="1_1.1", node="n1", passed_gates=frozenset({"canary_turn"})),
        Placement(arm="a", attempt="1_2.1", node="n3", passed_gates=frozenset({"canary_turn"})),
        Placement(arm="b", attempt="2_0.1", node="n4", passed_gates=frozenset({"canary_turn"})),
        Placement(arm="a", attempt="1_3.1", node="n2", passed_gates=frozenset({"canary_turn"})),
    ]
    assert gate_passed_elsewhere(failed, [failed, *others]) == "n1, n3"
    assert gate_passed_elsewhere(failed, [failed, others[2]]) is None


def test_two_gate_failures_on_a_node_that_passed_elsewhere_blame_the_node() -> None:
    gate = "node_tmpdir"
    failed = [
        Placement(arm="a", attempt=f"1_{task}.1", node="n3", failed_gate=gate) for task in (2, 5)
    ]
    passed = Placement(
        arm="a", attempt="1_0.1", node="n1", fruitful=True, passed_gates=frozenset({gate})
    )
    [found] = blame([*failed, passed]).values()
    assert found.node == "n3"
    assert found.failures == (
        "1_2.1: gate node_tmpdir failed (passed on n1)",
        "1_5.1: gate node_tmpdir failed (passed on n1)",
    )
    # A gate that failed everywhere is the campaign's: no node is blamed for it.
    assert blame(failed) == {}


def test_exclusions_say_why_and_whether_they_leave_a_node() -> None:
    placements = [_failed("1_0", "n2"), _failed("1_1", "n2"), _fruitful("1_2.1", "n1")]
    exclusions = Exclusions(earlier=("n3",), blamed=blame(placements))
    assert exclusions.nodes == ("n2", "n3")
    assert exclusions.why("n3") == "node n3 excluded in an earlier round"
    assert exclusions.why("n2") == "node n2 excluded (2 attempts failed there)"
    assert exclusions.why("n1") is None
    assert exclusions.leaves_nothing(["n2", "n3"])
    assert not exclusions.leaves_nothing(["n1", "n2", "n3"])
    assert not exclusions.leaves_nothing([])  # nodes unknown: nothing to say
