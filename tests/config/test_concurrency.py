"""Concurrency `auto`: the option's and the arm key's parsing, their errors, what they resolve
to, and that neither enters an item's identity."""

from __future__ import annotations

import pytest

from pytest_haico.config.concurrency import ConcurrencyPlan, parse_concurrency, resolve_concurrency
from pytest_haico.config.experiment import Arm, Script
from pytest_haico.config.identity import item_id, model_identity
from pytest_haico.config.sections import RunSection
from pytest_haico.config.settings import Profile
from pytest_haico.errors import ConfigError

SCRIPT = Script.model_validate({"id": "plan", "turns": [{"user": "Plan a trip."}]})


@pytest.mark.parametrize(("raw", "parsed"), [("auto", "auto"), (" AUTO ", "auto"), ("12", 12)])
def test_the_option_takes_a_number_or_auto(raw: str, parsed: object) -> None:
    assert parse_concurrency(raw, "--haico-concurrency") == parsed


@pytest.mark.parametrize("raw", ["fast", "0", "1025", "", "2.5"])
def test_the_option_refuses_other_words_naming_auto(raw: str) -> None:
    with pytest.raises(ConfigError, match="integer from 1 to 1024 or auto") as caught:
        parse_concurrency(raw, "--haico-concurrency")
    assert str(caught.value).startswith("--haico-concurrency: ")


def test_the_option_wins_over_the_arm_and_auto_is_bounded_by_max_concurrency() -> None:
    fixed = RunSection(concurrency=4, max_concurrency=12)
    auto = RunSection(concurrency="auto")
    assert resolve_concurrency(None, fixed) == ConcurrencyPlan(False, 4, 4)
    assert resolve_concurrency("auto", fixed) == ConcurrencyPlan(True, 1, 12)
    assert resolve_concurrency(None, auto) == ConcurrencyPlan(True, 1, 16)  # the default max
    assert resolve_concurrency(3, auto) == ConcurrencyPlan(False, 3, 3)
    assert resolve_concurrency(None, auto).describe() == "auto (1 to 16)"


def _arm(run: dict[str, object], standin: dict[str, object] | None = None) -> Arm:
    return Arm.model_validate({"name": "demo", "run": run, "standin": standin or {}})


def _identity(arm: Arm) -> str:
    model = model_identity(arm, profile=Profile.LOCAL)
    return item_id(arm, SCRIPT, 0, model=model, backend="b")


def test_concurrency_and_the_standins_max_num_seqs_stay_out_of_the_item_id() -> None:
    base = _identity(_arm({"concurrency": 8}))
    assert _identity(_arm({"concurrency": "auto"})) == base
    assert _identity(_arm({"concurrency": "auto", "max_concurrency": 64})) == base
    assert _identity(_arm({"concurrency": 1}, {"max_num_seqs": 2})) == base
    assert _identity(_arm({}, {"latency_ms": 5})) != base  # what the replies depend on does


def test_the_pass_rule_stays_out_of_the_item_id() -> None:
    base = _identity(_arm({}))
    assert _identity(_arm({"pass_rule": "k_of_n:3/5"})) == base
    assert _arm({"pass_rule": "majority"}).run.pass_rule == "majority"


def test_blank_on_enters_the_item_id_only_when_set() -> None:
    base = _identity(_arm({}))
    assert _identity(_arm({}, {"blank_on": ""})) == base
    assert _identity(_arm({}, {"blank_on": "hard"})) != base
    assert "blank_on" not in model_identity(_arm({}), profile=Profile.LOCAL)
