"""`haico` finds the project's pytest configuration as pytest does: the same file, the same
rootdir and the same `haico_*` values, from whichever directory it runs in."""

from __future__ import annotations

import fnmatch
from pathlib import Path

import pytest

from pytest_haico.config.options import BY_NOUN
from pytest_haico.config.project import find_project_config
from pytest_haico.errors import ConfigError

PYTEST_9 = pytest.mark.skipif(pytest.version_tuple < (9,), reason="a file pytest 9 reads")
RESULTS = BY_NOUN["results"]

# name -> (files under the project, the directory pytest and haico run in)
LAYOUTS: dict[str, tuple[dict[str, str], str]] = {
    "pytest.ini without a [pytest] section, from below": ({"pytest.ini": "[other]\n"}, "sub"),
    "pytest.ini before pyproject.toml": (
        {
            "pytest.ini": "[pytest]\nhaico_results = from-ini\n",
            "pyproject.toml": '[tool.pytest.ini_options]\nhaico_results = "from-toml"\n',
        },
        ".",
    ),
    "pyproject.toml without pytest's table is passed over": (
        {
            "sub/pyproject.toml": "[project]\nname = 'x'\n",
            "tox.ini": "[pytest]\nhaico_results = from-tox\n",
        },
        "sub",
    ),
    "tox.ini without [pytest], then setup.cfg's [tool:pytest]": (
        {
            "sub/tox.ini": "[tox]\nenvlist = py311\n",
            "sub/setup.cfg": "[tool:pytest]\nhaico_results = from-cfg\n",
            "pytest.ini": "[pytest]\nhaico_results = too-far-up\n",
        },
        "sub/deeper",
    ),
    "only a pyproject.toml without pytest's table names the rootdir": (
        {"sub/pyproject.toml": "[project]\nname = 'x'\n"},
        "sub/deeper",
    ),
    "setup.py names the rootdir when no file configures pytest": ({"setup.py": ""}, "sub"),
    "nothing: the directory it runs in": ({}, "sub"),
    "pyproject.toml's ini options with a multi-line value": (
        {"pyproject.toml": '[tool.pytest.ini_options]\nhaico_results = """a\nb"""\n'},
        ".",
    ),
}
PYTEST_9_LAYOUTS: dict[str, tuple[dict[str, str], str]] = {
    "pytest.toml before pytest.ini": (
        {
            "pytest.toml": '[pytest]\nhaico_results = "from-pytest-toml"\n',
            "pytest.ini": "[pytest]\nhaico_results = from-ini\n",
        },
        "sub",
    ),
    "pyproject.toml's native [tool.pytest]": (
        {"pyproject.toml": '[tool.pytest]\nhaico_results = "native"\n'},
        "sub",
    ),
}


def _lay_out(root: Path, files: dict[str, str], cwd: str) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    here = root / cwd
    here.mkdir(parents=True, exist_ok=True)
    return here


@pytest.mark.parametrize(
    "layout",
    [
        *LAYOUTS,
        *(pytest.param(name, marks=PYTEST_9) for name in PYTEST_9_LAYOUTS),
    ],
)
def test_haico_finds_the_file_rootdir_and_values_pytest_finds(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, layout: str
) -> None:
    files, cwd = {**LAYOUTS, **PYTEST_9_LAYOUTS}[layout]
    here = _lay_out(pytester.path, files, cwd)
    monkeypatch.chdir(here)

    config = pytester.parseconfig()
    found = find_project_config(here)

    assert (found.rootdir, found.path) == (config.rootpath, config.inipath)
    assert found.ini(RESULTS) == config.getini("haico_results")


def test_ini_values_keep_their_case_and_are_not_interpolated(tmp_path: Path) -> None:
    (tmp_path / "pytest.ini").write_text(
        "[pytest]\nhaico_results = %(home)s/r\nHAICO_CAMPAIGN = x\n"
    )

    found = find_project_config(tmp_path)

    assert found.ini(RESULTS) == "%(home)s/r"
    assert found.ini(BY_NOUN["campaign"]) is None  # pytest knows no HAICO_CAMPAIGN either


def test_a_repeatable_option_is_split_as_pytest_splits_an_args_value(tmp_path: Path) -> None:
    (tmp_path / "pytest.ini").write_text("[pytest]\nhaico_arm = a 'b c'\n")

    assert find_project_config(tmp_path).ini(BY_NOUN["arm"]) == ["a", "b c"]


@PYTEST_9
def test_a_native_toml_value_of_the_wrong_type_names_the_file_and_the_option(
    tmp_path: Path,
) -> None:
    (tmp_path / "pyproject.toml").write_text("[tool.pytest]\nhaico_results = 5\n")
    found = find_project_config(tmp_path)

    with pytest.raises(ConfigError) as raised:
        found.ini(RESULTS)

    assert str(raised.value) == (
        f"{tmp_path / 'pyproject.toml'}: config option 'haico_results' expects a string, got int: 5"
    )


@pytest.mark.parametrize(
    ("name", "text", "problem"),
    [
        ("pyproject.toml", "[tool.pytest.ini_options\n", "Expected ']' at the end of a table*"),
        ("pytest.ini", "haico_results = x\n", "File contains no section headers.*"),
        ("tox.ini", "[pytest]\na = 1\na = 2\n", "While reading from*option 'a'*already exists"),
    ],
)
def test_a_malformed_file_is_one_error_naming_it(
    tmp_path: Path, name: str, text: str, problem: str
) -> None:
    (tmp_path / name).write_text(text)

    with pytest.raises(ConfigError) as raised:
        find_project_config(tmp_path)

    prefix, _, detail = str(raised.value).replace("\n", " ").partition(": cannot read ")
    assert prefix == str(tmp_path / name)
    assert fnmatch.fnmatch(detail, f"the pytest configuration: {problem}"), detail
