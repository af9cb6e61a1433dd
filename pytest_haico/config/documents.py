"""Script files into plain documents: YAML without aliases or duplicate keys, JSON, JSONL."""

from __future__ import annotations

import json
from collections.abc import Hashable, Iterator
from pathlib import Path
from typing import Any

import yaml

from pytest_haico.errors import ConfigError
from pytest_haico.files import NotAnInputError, read_input_file

# 16 MiB holds about 100,000 short scripts (the item bound). JSONL parses that in a
# second; pure-Python PyYAML at 0.2-1 MB/s takes minutes, so big generated sets belong
# in JSONL, and anything larger is a runaway generator rather than a campaign.
MAX_SCRIPT_FILE_BYTES = 16 * 1024 * 1024
# A YAML file parses in seconds up to this size (a few thousand scripts); past it, PyYAML
# would hold collection for minutes (100,000 scripts: over 200 s), so it is refused.
MAX_YAML_FILE_BYTES = 2 * 1024 * 1024
SCRIPT_SUFFIXES = frozenset({".yaml", ".yml", ".json", ".jsonl"})

_ONCE = "each key may appear once in a mapping"
_ANCHORS = (
    "YAML anchors and aliases (&name, *name) are not accepted in script files: write each value out"
)
_MERGES = "YAML merge keys (<<) are not accepted in script files: write the keys out"
_DEEP = "nested too deeply to be a script (a mapping with 'id' and 'turns')"
_MERGE_TAG = "tag:yaml.org,2002:merge"


def is_script_file(path: Path) -> bool:
    """`*.yaml`, `*.yml`, `*.json` or `*.jsonl` in any letter case; dotfiles are not scripts."""
    return (
        path.suffix.lower() in SCRIPT_SUFFIXES and not path.name.startswith(".") and path.is_file()
    )


def is_jsonl(path: Path) -> bool:
    """One script mapping per line, numbered by line."""
    return path.suffix.lower() == ".jsonl"


def iter_documents(path: Path) -> Iterator[tuple[int, int | None, Any]]:
    """(position, line, document): the script's position in the file counted from 1 (0 for a
    file holding one mapping) and the line it starts on (None where the parser cannot tell)."""
    text = _read(path)
    if is_jsonl(path):
        yield from _iter_jsonl(path, text)
        return
    suffix = path.suffix.lower()
    if suffix != ".json" and len(text) > MAX_YAML_FILE_BYTES:
        raise ConfigError(
            str(path),
            "",
            f"the YAML file has {len(text)} characters, more than {MAX_YAML_FILE_BYTES} "
            "(PyYAML would take minutes): write a generated set as JSONL, one script a line",
        )
    if not text.strip():
        raise ConfigError(str(path), "", "the file is empty; expected a script mapping or a list")
    lines: list[int] = []
    try:
        document = _parse_json(path, text) if suffix == ".json" else _parse_yaml(path, text, lines)
    except RecursionError:
        raise ConfigError(str(path), "", _DEEP) from None
    if document is None:
        raise ConfigError(str(path), "", "the file is empty; expected a script mapping or a list")
    if isinstance(document, list):
        if not document:
            raise ConfigError(
                str(path), "", "the file holds an empty list; expected at least one script"
            )
        for position, item in enumerate(document, start=1):
            yield position, lines[position - 1] if len(lines) == len(document) else None, item
    else:
        yield 0, None, document


def describe_place(path: Path, position: int, line: int | None) -> str:
    """Where a script is, as people count: `s.yaml:7 (script 2)`; just the file when it
    holds one mapping."""
    at = f"{path}:{line}" if line is not None else str(path)
    return f"{at} (script {position})" if position else at


def _read(path: Path) -> str:
    try:
        # Checked on the opened file: a runaway generator's output is refused, not
        # loaded, and a FIFO is refused instead of blocking collection.
        return read_input_file(path, max_bytes=MAX_SCRIPT_FILE_BYTES).decode("utf-8")
    except NotAnInputError as exc:
        raise ConfigError(
            str(path),
            "",
            f"the script file {exc.problem}: "
            "make it a regular file, or split it into several files",
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(str(path), "", f"cannot read the script file: {exc}") from None


def _iter_jsonl(path: Path, text: str) -> Iterator[tuple[int, int | None, Any]]:
    found = 0
    # Lines end at "\n" only: str.splitlines would also split at U+2028 inside a string.
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            document = _JSONL_DECODER.decode(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(
                where, "", f"JSON syntax error: {exc.msg} (column {exc.colno})"
            ) from None
        except _DuplicateKeyError as exc:
            raise ConfigError(where, "", f"duplicate key {exc.key!r}; {_ONCE}") from None
        except RecursionError:
            raise ConfigError(where, "", _DEEP) from None
        found += 1
        yield found, number, document
    if not found:
        raise ConfigError(str(path), "", "the file is empty; expected one script mapping per line")


def _parse_json(path: Path, text: str) -> Any:
    closed = 0  # objects completed so far: json calls the hook as each one closes

    def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        nonlocal closed
        closed += 1
        return _unique_keys(pairs)

    try:
        return json.loads(text, object_pairs_hook=unique_keys)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"{path}:{exc.lineno}", "", f"JSON syntax error: {exc.msg} (column {exc.colno})"
        ) from None
    except _DuplicateKeyError as exc:
        raise ConfigError(
            f"{path}:{_line_of_object(text, closed)}",
            "",
            f"duplicate key {exc.key!r} in the mapping that starts on this line; {_ONCE}",
        ) from None


def _parse_yaml(path: Path, text: str, lines: list[int]) -> Any:
    """The document; `lines` gets the first line of each item of a top-level list."""
    loader = _ScriptLoader(text)  # a SafeLoader subclass
    try:
        node = loader.get_single_node()
        if isinstance(node, yaml.SequenceNode):
            lines.extend(item.start_mark.line + 1 for item in node.value)
        return None if node is None else loader.construct_document(node)
    except _RefusedError as exc:
        number = exc.problem_mark.line + 1 if exc.problem_mark is not None else 0
        raise ConfigError(f"{path}:{number}", "", str(exc.problem)) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{path}{line}", "", f"YAML syntax error: {problem}") from None
    finally:
        loader.dispose()


class _DuplicateKeyError(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """JSON's object hook: a repeated key is an error (json keeps the last one silently)."""
    mapping = dict(pairs)
    if len(mapping) < len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKeyError(key)
            seen.add(key)
    return mapping


# One decoder for every line: json.loads with a hook builds a new one per call.
_JSONL_DECODER = json.JSONDecoder(object_pairs_hook=_unique_keys)


def _line_of_object(text: str, number: int) -> int:
    """The line where the `number`-th JSON object to close opens (json's hook knows no
    positions); a character scan paid only on the error path."""
    opened: list[int] = []
    closed = 0
    in_string = escaped = False
    for index, char in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char == "{":
            opened.append(index)
        elif char == "}" and opened:
            start = opened.pop()
            closed += 1
            if closed == number:
                return text.count("\n", 0, start) + 1
    return 1


class _RefusedError(yaml.MarkedYAMLError):
    """Valid YAML that script files refuse by design."""


class _ScriptLoader(yaml.SafeLoader):
    """SafeLoader without anchors, aliases and merge keys (a few KB of aliases expand to
    gigabytes; scripts never need them), and with duplicate keys as errors."""

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        event = self.peek_event()  # type: ignore[no-untyped-call]
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            raise _RefusedError(problem=_ANCHORS, problem_mark=event.start_mark)
        return super().compose_node(parent, index)

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Hashable, Any]:
        for key_node, _ in node.value:
            if key_node.tag == _MERGE_TAG:
                raise _RefusedError(problem=_MERGES, problem_mark=key_node.start_mark)
        mapping = super().construct_mapping(node, deep=deep)
        if len(mapping) < len(node.value):
            first_line: dict[Hashable, int] = {}
            for key_node, _ in node.value:
                key = self.construct_object(key_node)
                if key in first_line:
                    problem = f"duplicate key {key!r} (first on line {first_line[key]}); {_ONCE}"
                    raise _RefusedError(problem=problem, problem_mark=key_node.start_mark)
                first_line[key] = key_node.start_mark.line + 1
        return mapping
