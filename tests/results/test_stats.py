"""The paired statistics against published values, and the pairing's properties."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_haico.config.pass_rule import parse_pass_rule
from pytest_haico.results import Record
from pytest_haico.results.paired import OVERALL, compare_records, repeat_figures
from pytest_haico.results.stats import (
    PairedTable,
    decide,
    mcnemar,
    median_difference,
    paired_difference,
    pairs_needed,
    pass_at_k,
    pass_hat_k,
    wilson,
)

ARM_DIR = Path("/results/c/demo")


# Newcombe (1998), "Two-sided confidence intervals for the single proportion: comparison of
# seven methods", Stat Med 17:857-872, Table I, method 3 (score interval without correction).
@pytest.mark.parametrize(
    ("passed", "n", "low", "high"),
    [
        (81, 263, 0.2553, 0.3662),
        (15, 148, 0.0624, 0.1605),
        (0, 20, 0.0, 0.1611),
        (1, 29, 0.0061, 0.1718),
    ],
)
def test_wilson_intervals_are_newcombes_published_ones(
    passed: int, n: int, low: float, high: float
) -> None:
    rate = wilson(passed, n)
    assert (round(rate.low, 4), round(rate.high, 4)) == (low, high)
    assert rate.value == passed / n


def test_a_rate_of_nothing_is_the_whole_range_and_prints_as_such() -> None:
    assert wilson(0, 0).text() == "- (0/0)"
    assert (wilson(0, 0).low, wilson(0, 0).high) == (0.0, 1.0)
    assert wilson(182, 200).text() == "91.0% [86.2, 94.2] (182/200)"
    with pytest.raises(ValueError, match="between 0 and n"):
        wilson(3, 2)


# Fagerland, Lydersen, Laake, "Statistical Analysis of Contingency Tables" (2017), ch. 8:
# complete response before and after consolidation therapy (Cavo et al. 2012), 59 6 / 16 80;
# the Newcombe square-and-add interval of before − after is −0.0621 (−0.1186 to −0.0046).
def test_the_paired_difference_is_newcombes_interval_on_cavos_table() -> None:
    # A = before, B = after: B − A is the book's difference with the sign turned.
    table = PairedTable(both=59, lost=6, gained=16, neither=80)
    difference = paired_difference(table)
    assert round(difference.value, 4) == 0.0621
    assert (round(difference.low, 4), round(difference.high, 4)) == (0.0046, 0.1186)
    assert difference.text() == "+6.2 points [+0.5, +11.9]"
    mirrored = paired_difference(PairedTable(both=59, lost=16, gained=6, neither=80))
    assert (round(mirrored.low, 4), round(mirrored.high, 4)) == (-0.1186, -0.0046)


# The same book, and Fagerland, Lydersen, Laake (2013), BMC Med Res Methodol 13:91: the
# exact conditional McNemar p of Bentur et al. (2009), 1 and 7 discordant, is 0.070, and of
# Cavo et al. (2012), 6 and 16, 0.052.
@pytest.mark.parametrize(
    ("lost", "gained", "p"), [(1, 7, 0.0703), (6, 16, 0.0525), (7, 1, 0.0703), (0, 10, 0.0020)]
)
def test_mcnemars_exact_p_on_published_tables(lost: int, gained: int, p: float) -> None:
    assert round(mcnemar(PairedTable(both=1, lost=lost, gained=gained, neither=12)), 4) == p


def test_no_discordant_pair_is_p_1() -> None:
    assert mcnemar(PairedTable(both=5, neither=5)) == 1.0


def test_the_bootstrap_interval_is_the_same_for_the_same_differences_in_any_order() -> None:
    differences = [float(x % 7) - 2.5 for x in range(60)]
    first = median_difference(differences)
    random.Random(1).shuffle(differences)
    again = median_difference(differences)
    assert first == again
    assert first.resamples == 2000
    assert (first.value, first.low, first.high) == (0.5, -0.5, 1.5)
    assert median_difference([]).value is None
    assert median_difference([2.0, 2.0, 2.0]).low == 2.0  # no spread: no resampling


def test_pass_at_k_and_pass_hat_k_are_the_unbiased_estimators() -> None:
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4)
    assert pass_at_k(5, 2, 4) == 1.0
    assert pass_at_k(3, 0, 3) == 0.0
    assert pass_hat_k(5, 3, 2) == pytest.approx(3 / 10)
    assert pass_hat_k(4, 4, 4) == 1.0
    with pytest.raises(ValueError, match="1 ≤ k ≤ n"):
        pass_at_k(2, 1, 3)


def test_pairs_needed_follow_connors_formula() -> None:
    # Connor (1987): n = (z_a √ψ + z_b √(ψ − δ²))² / δ², z for 95% two-sided and 80%.
    assert pairs_needed(0.05, 0.05) == 155
    assert pairs_needed(0.01, 0.01) == 783
    assert pairs_needed(0.05, 0.10) == 312  # more discordance, more pairs
    assert pairs_needed(0.01, 0.01, max_drop=0.02) is None  # within the margin: never shown
    assert pairs_needed(0.0, 0.1) is None


def test_the_gate_fails_only_when_the_whole_interval_is_beyond_the_margin() -> None:
    five = paired_difference(PairedTable(both=190, lost=10))
    one = paired_difference(PairedTable(both=198, lost=2))
    assert decide(five, max_drop=0.02).failed
    assert decide(five, max_drop=0.02).line == (
        "FAIL: pass rate dropped by more than 2 point(s) at 95%: the upper bound of B − A, "
        "−2.1 points, is below −2"
    )
    assert not decide(five, max_drop=0.03).failed
    assert not decide(one, max_drop=0.0).failed
    assert decide(one, max_drop=0.0).line == (
        "pass: a drop of more than 0 point(s) in the pass rate is not shown at 95%: the upper "
        "bound of B − A, +1.0 points, is not below 0"
    )


@pytest.mark.parametrize("rule", ["all", "any", "majority", "k_of_n:3/5", "k_of_n:1/1"])
def test_pass_rules_parse(rule: str) -> None:
    assert str(parse_pass_rule(rule)) == rule


@pytest.mark.parametrize("rule", ["most", "k_of_n:4/3", "k_of_n:0/2", "k_of_n:3", ""])
def test_a_bad_pass_rule_names_where_and_the_rules(rule: str) -> None:
    with pytest.raises(ValueError, match=r".* is not a pass rule: give one of all"):
        parse_pass_rule(rule)


def test_pass_rules_make_one_verdict_of_the_repeats() -> None:
    votes = [True, True, False, False, True]
    assert [parse_pass_rule(r).passes(votes) for r in ("all", "any", "majority")] == [
        False,
        True,
        True,
    ]
    assert parse_pass_rule("k_of_n:3/5").passes(votes) is True
    assert parse_pass_rule("k_of_n:4/5").passes(votes) is False
    assert parse_pass_rule("k_of_n:3/4").passes(votes) is None


def record(
    script: str,
    verdict: str,
    *,
    repeat: int = 0,
    stratum: str = "default",
    arm: str = "demo",
    seconds: float = 1.0,
    tokens: int = 10,
) -> Record:
    data = {
        "arm": arm,
        "item_id": f"{arm}-{script}-{repeat}",
        "run_id": "r.1",
        "attempt": 1,
        "verdict": verdict,
        "finished_at": "2026-01-01T00:00:00",
        "duration_s": seconds,
        "stratum": stratum,
        "script": script,
        "repeat": repeat,
        "turns": [{"index": 0, "tokens_in": tokens, "tokens_out": tokens}],
    }
    return Record(data, ARM_DIR / "ledger" / "r.1.jsonl", 1, ARM_DIR)


def test_compare_pairs_per_stratum_leaves_infra_out_and_counts_the_unpaired() -> None:
    a = [
        record("s1", "completed", seconds=1.0),
        record("s2", "completed", seconds=2.0),
        record("s3", "completed", stratum="long", seconds=10.0),
        record("s4", "infra_error"),
        record("s5", "completed"),
    ]
    b = [
        record("s1", "completed", seconds=1.5),
        record("s2", "blank_turn", seconds=1.0),
        record("s3", "completed", stratum="long", seconds=12.0, tokens=20),
        record("s4", "completed"),
        record("s6", "completed"),
    ]
    comparison = compare_records(a, b)
    assert [s.stratum for s in comparison.strata] == ["default", "long", OVERALL]
    default, long, overall = comparison.strata
    assert default.table == PairedTable(both=1, lost=1)
    assert (default.left_out, default.only_a, default.only_b) == ({"A infra_error": 1}, 1, 1)
    assert long.table == PairedTable(both=1)
    assert long.tokens.value == 20.0
    assert overall.table == PairedTable(both=2, lost=1)
    assert (overall.a.passed, overall.b.passed, overall.a.n) == (3, 2, 3)
    assert overall.latency.value == 0.5
    assert comparison.unit == "script × repeat"


def test_a_pass_rule_compares_scripts_and_leaves_out_one_with_a_failed_repeat() -> None:
    a = [record("s1", "completed", repeat=r) for r in range(3)]
    a += [record("s2", "completed", repeat=r) for r in range(3)]
    a += [record("s3", "completed", repeat=r) for r in range(3)]
    b = [record("s1", v, repeat=r) for r, v in enumerate(["completed", "blank_turn", "completed"])]
    b += [
        record("s2", v, repeat=r) for r, v in enumerate(["completed", "blank_turn", "blank_turn"])
    ]
    b += [
        record("s3", v, repeat=r) for r, v in enumerate(["completed", "infra_error", "completed"])
    ]
    comparison = compare_records(a, b, pass_rule=parse_pass_rule("majority"))
    assert comparison.overall.table == PairedTable(both=1, lost=1)
    assert comparison.unit == "script (pass_rule majority)"
    assert comparison.overall.left_out == {"B infra_error": 1}
    per_repeat = compare_records(a, b)
    assert per_repeat.overall.table == PairedTable(both=5, lost=3)


def test_repeat_figures_per_arm_and_stratum() -> None:
    records = [record("s1", v, repeat=r) for r, v in enumerate(["completed"] * 3)]
    records += [
        record("s2", v, repeat=r) for r, v in enumerate(["completed", "blank_turn", "blank_turn"])
    ]
    records += [record("s3", "completed", stratum="long")]  # one repeat: no figures
    (figures,) = repeat_figures(records)
    assert (figures.arm, figures.stratum, figures.k, figures.scripts) == ("demo", "default", 3, 2)
    assert figures.pass_at_k == 1.0
    assert figures.pass_hat_k == 0.5
    assert figures.consistent == 1


VERDICTS = st.sampled_from(["completed", "blank_turn", "expectation_failed", "infra_error"])
SIDES = st.lists(
    st.tuples(
        st.integers(0, 30), st.integers(0, 2), VERDICTS, VERDICTS, st.booleans(), st.booleans()
    ),
    max_size=60,
    unique_by=lambda t: (t[0], t[1]),
)


@settings(max_examples=60, deadline=None)
@given(items=SIDES, seed=st.integers(0, 2**32 - 1))
def test_shuffled_records_give_the_same_comparison_and_every_item_is_counted(
    items: list[tuple[int, int, str, str, bool, bool]], seed: int
) -> None:
    a = [record(f"s{s}", va, repeat=r, seconds=s) for s, r, va, _, in_a, _ in items if in_a]
    b = [record(f"s{s}", vb, repeat=r, seconds=r) for s, r, _, vb, _, in_b in items if in_b]
    first = compare_records(a, b)
    rng = random.Random(seed)
    rng.shuffle(a)
    rng.shuffle(b)
    assert compare_records(a, b) == first
    overall = first.overall
    both = [t for t in items if t[4] and t[5]]
    infra = [t for t in both if "infra_error" in (t[2], t[3])]
    assert overall.table.n == len(both) - len(infra)
    assert sum(overall.left_out.values()) == sum((t[2], t[3]).count("infra_error") for t in infra)
    assert overall.only_a == sum(1 for t in items if t[4] and not t[5])
    assert overall.only_b == sum(1 for t in items if t[5] and not t[4])
    assert overall.a.passed == sum(1 for t in both if t not in infra and t[2] == "completed")
