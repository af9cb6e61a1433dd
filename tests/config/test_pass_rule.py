"""The arm's `[run] pass_rule`: a bad one is refused at load time, naming the file, the
field and the rules."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_haico.config.experiment import load_arm
from pytest_haico.errors import ConfigError


def test_a_bad_pass_rule_names_the_arm_file_the_field_and_the_rules(tmp_path: Path) -> None:
    path = tmp_path / "demo.toml"
    path.write_text('[run]\npass_rule = "k_of_n:5/3"\n')
    with pytest.raises(ConfigError) as caught:
        load_arm(path)
    assert str(caught.value) == (
        f"{path}: run.pass_rule: 'k_of_n:5/3' is not a pass rule: give one of all, any, "
        "majority, k_of_n:K/N, with 1 ≤ K ≤ N (e.g. k_of_n:3/5: at least 3 of the script's 5 "
        "repeats pass)"
    )


def test_a_good_pass_rule_loads(tmp_path: Path) -> None:
    path = tmp_path / "demo.toml"
    path.write_text('[run]\npass_rule = "k_of_n:3/5"\n')
    assert load_arm(path).run.pass_rule == "k_of_n:3/5"


def test_a_blank_on_that_is_no_regular_expression_is_refused_at_load(tmp_path: Path) -> None:
    path = tmp_path / "demo.toml"
    path.write_text('[standin]\nblank_on = "(hard"\n')
    with pytest.raises(ConfigError) as caught:
        load_arm(path)
    assert str(caught.value).startswith(
        f"{path}: standin.blank_on: not a regular expression: missing ), unterminated subpattern"
    )
