"""Script files: which are read, and the inputs their parsers refuse instead of guessing."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_haico.config.experiment import iter_scripts
from pytest_haico.errors import ConfigError


def script_error(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        list(iter_scripts(path))
    return str(caught.value)


def assert_message(message: str, pattern: str) -> None:
    pytest.LineMatcher([message]).fnmatch_lines([pattern])


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        (
            "s.yaml",
            "id: a\nturns:\n  - user: hi\nid: b\n",
            "*s.yaml:4: duplicate key 'id' (first on line 1); each key may appear once in a map*",
        ),
        (
            "s.yml",
            "- id: a\n  turns: [{user: hi, expect: {artifact: true, artifact: false}}]\n",
            "*s.yml:2: duplicate key 'artifact' (first on line 2); each key*",
        ),
        (
            "s.jsonl",
            '{"id": "a", "turns": [{"user": "hi", "user": "ho"}]}\n',
            "*s.jsonl:1: duplicate key 'user'; each key may appear once in a mapping",
        ),
        (
            "s.json",
            '[\n  {"id": "a", "turns": [{"user": "hi"}]},\n'
            '  {"id": "b",\n   "turns": [{"user": "hi"}],\n   "id": "c"}\n]\n',
            "*s.json:3: duplicate key 'id' in the mapping that starts on this line; each key*",
        ),
    ],
)
def test_duplicate_keys_name_file_line_and_key(
    tmp_path: Path, name: str, text: str, message: str
) -> None:
    assert_message(script_error(tmp_path, name, text), message)


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("id: a\nturns:\n  - &t {user: hi}\n  - *t\n", 3),
        ("id: a\nturns:\n  - user: hi\n  - user: *undefined\n", 4),
    ],
)
def test_anchors_and_aliases_are_refused(tmp_path: Path, text: str, line: int) -> None:
    assert_message(
        script_error(tmp_path, "s.yaml", text),
        f"*s.yaml:{line}: YAML anchors and aliases (&name, *name) are not accepted in "
        "script files: write each value out",
    )


def test_merge_keys_are_refused(tmp_path: Path) -> None:
    assert_message(
        script_error(tmp_path, "s.yaml", "id: a\n<<: {stratum: long}\nturns: [{user: hi}]\n"),
        "*s.yaml:2: YAML merge keys (<<) are not accepted in script files: write the keys out",
    )


@pytest.mark.parametrize(
    ("name", "text"), [("s.yaml", "[" * 5000 + "]" * 5000), ("s.jsonl", "[" * 100_000)]
)
def test_deep_nesting_is_refused(tmp_path: Path, name: str, text: str) -> None:
    assert_message(
        script_error(tmp_path, name, text),
        "*s.*: nested too deeply to be a script (a mapping with 'id' and 'turns')",
    )


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("s.jsonl", "", "*s.jsonl: the file is empty; expected one script mapping per line"),
        ("s.yaml", "# nothing yet\n", "*s.yaml: the file is empty; expected a script mapping*"),
        ("s.yaml", "[]\n", "*s.yaml: the file holds an empty list; expected at least one script"),
        ("s.json", "[]", "*s.json: the file holds an empty list; expected at least one script"),
        ("s.json", " \n", "*s.json: the file is empty; expected a script mapping or a list"),
        ("s.json", '{"id": "a",', "*s.json:1: JSON syntax error: *"),
    ],
)
def test_empty_and_broken_files_are_refused(
    tmp_path: Path, name: str, text: str, message: str
) -> None:
    assert_message(script_error(tmp_path, name, text), message)


def test_a_json_file_holds_one_mapping_or_a_list(tmp_path: Path) -> None:
    one = tmp_path / "one.json"
    one.write_text('{"id": "a", "turns": [{"user": "hi"}]}')
    many = tmp_path / "many.JSON"
    many.write_text(
        '[{"id": "b", "turns": [{"user": "hi"}]}, {"id": "c", "turns": [{"user": "x"}]}]'
    )
    assert [s.script.id for s in iter_scripts(one)] == ["a"]
    assert [(s.script.id, s.position) for s in iter_scripts(many)] == [("b", 1), ("c", 2)]
