"""The project's pytest configuration as `haico` reads it: the file pytest would use when run
in a directory, its rootdir, and its `haico_*` ini values (found as pytest finds them,
read with tomllib and configparser)."""

from __future__ import annotations

import configparser
import shlex
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_haico.config.options import Option
from pytest_haico.config.resolution import Lookup, Resolver
from pytest_haico.errors import ConfigError

Values = Mapping[str, Any]


@dataclass(frozen=True)
class ProjectConfig:
    """The configuration file pytest would read (None: none), the rootdir, and its values;
    `native`: they keep their TOML types (`pytest.toml`, `[tool.pytest]`), else they are
    strings and lists of strings, as in an ini file."""

    rootdir: Path
    path: Path | None
    values: Values
    native: bool = False

    def ini(self, option: Option) -> Any:
        """The option's value as pytest's `getini` gives it; None when the file has none."""
        value = self.values.get(option.dest)
        if value is None:
            return None
        if self.native:
            kind: type = bool if option.flag else list if option.repeatable else str
            if not isinstance(value, kind):
                expected = {bool: "a bool", list: "a list", str: "a string"}[kind]
                raise ConfigError(
                    str(self.path),
                    "",
                    f"config option '{option.dest}' expects {expected}, "
                    f"got {type(value).__name__}: {value!r}",
                )
        elif option.repeatable and isinstance(value, str):
            return shlex.split(value)
        return value


def find_project_config(start: Path) -> ProjectConfig:
    """The first file, in `start` or a directory above it, that holds pytest configuration
    (in pytest's order of names); else the first pyproject.toml, else the first setup.py
    above `start` names the rootdir, else `start` itself is the rootdir."""
    first_pyproject: Path | None = None
    for base in (start, *start.parents):
        found = _config_in(base)
        if found is not None:
            path, (values, native) = found
            return ProjectConfig(rootdir=base, path=path, values=values, native=native)
        if first_pyproject is None and (base / "pyproject.toml").is_file():
            first_pyproject = base / "pyproject.toml"
    if first_pyproject is not None:
        return ProjectConfig(rootdir=first_pyproject.parent, path=first_pyproject, values={})
    setup_py = next(
        (base for base in (start, *start.parents) if (base / "setup.py").is_file()), None
    )
    return ProjectConfig(rootdir=setup_py or start, path=None, values={})


def config_file_in(directory: Path) -> Path | None:
    """The file in `directory` itself (not above it) that pytest would read its
    configuration from; None when none there holds any."""
    found = _config_in(directory)
    return found[0] if found is not None else None


def _config_in(base: Path) -> tuple[Path, tuple[Values, bool]] | None:
    for name, load in _LOADERS.items():
        path = base / name
        if path.is_file():
            found = _read(path, load)
            if found is not None:
                return path, found
    return None


def project_resolver(cli: Mapping[str, tuple[Any, str]], *, environ: Mapping[str, str]) -> Resolver:
    """The resolver of a `haico` command run in the current directory: `cli` holds what its
    flags gave (noun -> (value, flag)), the ini values are the project's."""
    here = Path.cwd()
    project = find_project_config(here)
    return Resolver(
        Lookup(
            cli=cli,
            environ=environ,
            ini=project.ini,
            rootdir=project.rootdir,
            invocation_dir=here,
        )
    )


# (values, native) when the file holds pytest configuration, else None.
_Found = tuple[Values, bool] | None


def _read(path: Path, load: Callable[[Path], _Found]) -> _Found:
    try:
        return load(path)
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, configparser.Error) as exc:
        problem = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ConfigError(
            str(path), "", f"cannot read the pytest configuration: {problem}"
        ) from None


class _IniFile(configparser.ConfigParser):
    """An ini file as pytest reads it: no interpolation, keys in the case they are written."""

    def __init__(self, path: Path) -> None:
        super().__init__(interpolation=None)
        self.read_string(path.read_text(encoding="utf-8"), source=str(path))

    def optionxform(self, optionstr: str) -> str:
        return optionstr


def _ini_section(path: Path, section: str, *, always: bool) -> _Found:
    """`section` of an ini file; a file that is always pytest's (pytest.ini) is so without it."""
    parser = _IniFile(path)
    if parser.has_section(section):
        return dict(parser.items(section)), False
    return ({}, False) if always else None


def _pytest_toml(path: Path) -> _Found:
    table = tomllib.loads(path.read_text(encoding="utf-8")).get("pytest", {})
    return dict(table), True


def _pyproject(path: Path) -> _Found:
    tool = tomllib.loads(path.read_text(encoding="utf-8")).get("tool", {}).get("pytest")
    if not isinstance(tool, dict):
        return None
    native = {key: value for key, value in tool.items() if key != "ini_options"}
    ini_options = tool.get("ini_options")
    if native and ini_options is not None:
        raise ConfigError(
            str(path),
            "",
            "cannot use both [tool.pytest] and [tool.pytest.ini_options]; pytest refuses it too",
        )
    if native:
        return native, True
    if ini_options is None:
        return None
    # As in pytest: the ini options' scalars are strings, their lists stay lists.
    return {k: v if isinstance(v, list) else str(v) for k, v in ini_options.items()}, False


# pytest's names of configuration files, in the order it tries them in each directory.
_LOADERS: dict[str, Callable[[Path], _Found]] = {
    "pytest.toml": _pytest_toml,
    ".pytest.toml": _pytest_toml,
    "pytest.ini": lambda path: _ini_section(path, "pytest", always=True),
    ".pytest.ini": lambda path: _ini_section(path, "pytest", always=True),
    "pyproject.toml": _pyproject,
    "tox.ini": lambda path: _ini_section(path, "pytest", always=False),
    "setup.cfg": lambda path: _ini_section(path, "tool:pytest", always=False),
}
