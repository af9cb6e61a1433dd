"""The generated reference pages: what is committed under docs/reference/ is what the code
renders, the command rewrites only what differs, and each page holds what its code says."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from pytest_haico import reference
from pytest_haico.cli import main as cli_main
from pytest_haico.config.options import OPTIONS
from pytest_haico.runner.stopping import StopKind

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", sorted(reference.PAGES))
def test_the_committed_page_is_what_the_code_renders(name: str) -> None:
    path = ROOT / reference.DOCS / name
    if not path.is_file() or path.read_text(encoding="utf-8") != reference.render_pages()[name]:
        pytest.fail(
            f"{reference.DOCS / name} differs from the code: run `{reference.REGENERATE}` "
            "to regenerate it",
            pytrace=False,
        )


def test_every_generated_page_is_in_the_site_navigation() -> None:
    navigation = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    assert all(f"reference/{name}" in navigation for name in reference.PAGES)


def test_the_command_rewrites_what_differs_and_check_names_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert reference.main(["--check"]) == 1
    assert capsys.readouterr().err.splitlines()[0] == (
        f"{reference.DOCS}/arm-and-scripts.md: differs from the code: run `{reference.REGENERATE}`"
    )
    assert reference.main([]) == 0
    assert len(capsys.readouterr().out.splitlines()) == len(reference.PAGES)
    (tmp_path / reference.DOCS / "options.md").write_text("stale\n")
    assert reference.main([]) == 0
    assert capsys.readouterr().out == f"{reference.DOCS}/options.md: rewritten\n"
    assert reference.main(["--check"]) == 0


def test_the_options_page_has_every_option_with_its_ini_key_and_variable() -> None:
    page = reference.render_options()
    for option in OPTIONS:
        assert f"| `{option.cli}" in page
        assert f"| `{option.dest}` | `{option.env}` |" in page


def test_the_exit_codes_page_has_every_stop_with_its_code() -> None:
    page = reference.render_exit_codes()
    for kind in StopKind:
        assert f"| `{kind.value}` | {kind.exit_code} |" in page


def test_a_stop_without_a_comment_cannot_be_rendered() -> None:
    import enum

    class Undocumented(enum.Enum):
        SAID = "said"  # what it is
        UNSAID = "unsaid"

    with pytest.raises(ValueError, match="Undocumented: no comment after UNSAID"):
        reference._member_comments(Undocumented)


def test_the_cli_page_has_every_command_and_its_options() -> None:
    page = reference.render_cli()
    parser = cli_main._parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, command in commands.choices.items():
        assert f"## `haico {name}`" in page
        flags = [flag for action in command._actions for flag in action.option_strings]
        assert all(f"`{flag}" in page for flag in flags if flag not in ("-h", "--help"))


def test_the_ledger_page_names_every_field_of_a_record() -> None:
    page = reference.render_ledger()
    assert "| `schema` | integer | `2` |" in page
    assert "| `turns` | list of [`TurnRecord`](#turnrecord) | `[]` |" in page
    assert "| `slurm` | [`SlurmInfo`](#slurminfo) or null | `null` |" in page


def test_the_hooks_page_shows_each_hook_and_its_parameters() -> None:
    page = reference.render_hooks()
    assert "def pytest_haico_judge_turn(turn: JudgedTurn, judge: ServedModel)" in page
    assert "@pytest.hookspec(firstresult=True)" in page
    assert "\n* `turn`: the question" in page
