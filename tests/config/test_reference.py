"""The arm and script reference (docs/reference/arm-and-scripts.md; tests/docs holds the
committed page to it): a key added to a model changes it, every key and persona has a
description, and what it says of numbering and the stand-ins is what the code does."""

from __future__ import annotations

import typing
from pathlib import Path

import pytest
from pydantic import Field

from pytest_haico.config import reference
from pytest_haico.config.experiment import Arm, iter_scripts
from pytest_haico.config.sections import PERSONAS, Persona, StandinSection
from pytest_haico.errors import ConfigError
from pytest_haico.standins import personas as standin_personas


class _WithANewKey(StandinSection):
    warmup_s: float = Field(default=2.5, ge=0, le=60)
    """Seconds the stand-in warms up."""


class _ArmWithANewKey(Arm):
    standin: _WithANewKey = _WithANewKey()


class _Undocumented(StandinSection):
    warmup_s: float = 2.5


class _ArmUndocumented(Arm):
    standin: _Undocumented = _Undocumented()


def test_a_key_added_to_a_model_changes_the_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    before = reference.render_reference()
    monkeypatch.setattr(reference, "Arm", _ArmWithANewKey)
    after = reference.render_reference()
    assert after != before
    row = "| `warmup_s` | number | `2.5` | from 0 to 60 | Seconds the stand-in warms up. |"
    assert row in after.splitlines()


def test_a_key_without_a_docstring_cannot_be_rendered(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reference, "Arm", _ArmUndocumented)
    with pytest.raises(ValueError, match=r"_Undocumented\.warmup_s has no description: write a"):
        reference.render_reference()


def test_the_reference_shows_bounds_defaults_and_checks() -> None:
    lines = reference.render_reference().splitlines()
    assert (
        "| `repeats` | integer | `1` | from 1 to 1,000 "
        "| How many items the script makes per arm (`-r0`, `-r1`, ...). |"
    ) in lines
    assert any(
        line.startswith('| `concurrency` | integer or `"auto"` | `8` | 1 to 1,024, or "auto" |')
        for line in lines
    )
    assert any(
        line.startswith("| `id` | string | required | 1 to 128 characters;") for line in lines
    )
    assert "### `turns[].expect`" in lines
    assert all(f"| `{name}` |" in "\n".join(lines) for name in typing.get_args(Persona))


def test_every_persona_of_the_arm_file_is_a_persona_of_the_standin() -> None:
    names = list(typing.get_args(Persona))
    assert list(PERSONAS) == names
    assert [persona.value for persona in standin_personas.Persona] == names
    # The figures the descriptions give are the stand-in's.
    assert standin_personas.FLAKY_SHARE == 0.5 and PERSONAS["flaky"].startswith("answers half")
    assert f"{standin_personas.SLOW_EXTRA_MS // 1000} s later" in PERSONAS["slow"]


def test_messages_number_scripts_and_turns_from_1_as_the_reference_says(tmp_path: Path) -> None:
    assert "Messages count from 1: `scripts/s.yaml:7 (script 2): turn 3" in (
        reference.render_reference()
    )
    path = tmp_path / "s.yaml"
    path.write_text(
        "- id: first\n"
        "  turns:\n"
        "    - user: hi\n"
        "- id: second\n"
        "  turns:\n"
        "    - user: one\n"
        "    - user: two\n"
        "    - user: three\n"
        "      expect: {matches: '('}\n"
    )
    with pytest.raises(ConfigError) as caught:
        list(iter_scripts(path))
    assert str(caught.value).startswith(f"{path}:4 (script 2): turn 3, expect.matches: ")
