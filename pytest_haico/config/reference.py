"""The arm and script reference, rendered as Markdown from the models themselves (each key's
type, default, bounds and docstring) and from the stand-in personas' descriptions: the body
of the documentation's page `docs/reference/arm-and-scripts.md` (`pytest_haico.reference`
writes it)."""

from __future__ import annotations

import ast
import inspect
import itertools
import textwrap
import types
import typing
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from annotated_types import Ge, Gt, Le, Lt, MaxLen, MinLen
from pydantic import AfterValidator, BaseModel, PlainValidator
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from pytest_haico.config import bounds, expect, limits
from pytest_haico.config.expect import Expect
from pytest_haico.config.experiment import Arm, Script
from pytest_haico.config.sections import PERSONAS, Persona, Section
from pytest_haico.durations import SLURM_TIME_FORMATS

# What each validator a key passes through asks of its value, in the bounds column.
_VALIDATORS: dict[Callable[..., Any], str] = {
    bounds.not_blank: "not blank",
    bounds.check_concurrency: f'1 to {limits.MAX_CONCURRENCY:,}, or "auto"',
    bounds.check_slurm_time: f"a Slurm time limit ({SLURM_TIME_FORMATS})",
    bounds.check_parser_name: "one word",
    expect.check_regular_expression: "compiles as a Python regular expression",
}
_TYPES = {int: "integer", float: "number", bool: "boolean", str: "string"}


def render_reference() -> str:
    """The reference's Markdown."""
    return "\n".join(_lines()) + "\n"


def _lines() -> Iterator[str]:
    yield "## The arm file: `experiments/arms/<arm>.toml`"
    yield ""
    yield (
        "The arm's name is the file's stem. Every key has a default, but an empty file is "
        "refused (set at least `description`); unknown keys are refused, and values are not "
        'converted (`8` is not `"8"`). The sections are TOML tables (`[vllm]`).'
    )
    yield from _tables(Arm, "", skip=frozenset({"name"}))
    yield ""
    yield "## A script: `experiments/scripts/*.yaml|*.yml|*.json|*.jsonl`"
    yield ""
    yield (
        "A YAML or JSON file holds one script (a mapping) or several (a list); a JSONL file "
        "holds one script per line. Unknown keys are refused."
    )
    yield from _tables(Script, "")
    yield ""
    yield "## Numbering"
    yield ""
    yield (
        "Messages count from 1: `scripts/s.yaml:7 (script 2): turn 3, expect.matches` is "
        "the file's second script, at line 7, and its third turn. `branch_from` is a value, "
        "not a message: it counts turns from 0, as the `turns` list does (`branch_from: 0` "
        "forks after the first turn). Repeats count from 0 in test ids (`-r0`), and the "
        "ledger's `repeat` and `turn_index` from 0, as data."
    )
    yield ""
    yield "## The stand-in personas: `[standin] persona`"
    yield ""
    yield (
        "The local profile's stand-in model answers as its persona says, from the seed and "
        "the messages alone, so a conversation replays identically. A guided request (a "
        'named or `"required"` tool_choice) gets a valid tool call from every persona but '
        "`dead`."
    )
    yield ""
    yield "| persona | the stand-in model |"
    yield "| --- | --- |"
    for persona in typing.get_args(Persona):
        yield f"| `{persona}` | {PERSONAS[persona]} |"


def _tables(
    model: type[BaseModel], where: str, *, skip: frozenset[str] = frozenset()
) -> Iterator[str]:
    """The table of `model`'s own keys, then one per key that holds a table."""
    rows: list[str] = []
    nested: list[tuple[str, type[BaseModel]]] = []
    for name, field in model.model_fields.items():
        if name in skip:
            continue
        inner = _section_of(field.annotation)
        if inner is not None:
            many = typing.get_origin(_without_none(field.annotation)) is list
            place = f"{where}{name}[]" if many else f"{where}{name}"
            nested.append((place, inner))
            if not many:
                continue
        kind, limits = _kind(field.annotation, field.metadata)
        rows.append(
            f"| `{name}` | {kind} | {_default(field)} | {'; '.join(limits)} "
            f"| {_description(model, name, field)} |"
        )
    if rows:
        yield ""
        if where:
            yield f"### `{_heading(where)}`"
            yield ""
            yield _description_of(model)
            yield ""
        yield "| key | type | default | bounds | what it is |"
        yield "| --- | --- | --- | --- | --- |"
        yield from rows
    for place, inner in nested:
        yield from _tables(inner, f"{place}.")


def _heading(where: str) -> str:
    place = where.removesuffix(".")
    return place if "[]" in place else f"[{place}]"


def _description_of(model: type[BaseModel]) -> str:
    return " ".join((model.__doc__ or "").split())


def _description(model: type[BaseModel], name: str, field: FieldInfo) -> str:
    text = field.description or _field_docstrings(model).get(name)
    if not text:
        raise ValueError(
            f"{model.__name__}.{name} has no description: write a docstring under the field"
        )
    return " ".join(text.split()).replace("|", "\\|")


def _field_docstrings(model: type[BaseModel]) -> dict[str, str]:
    """The docstring under each field of `model` and its bases (the nearest class's wins)."""
    found: dict[str, str] = {}
    for cls in reversed([c for c in model.__mro__ if issubclass(c, BaseModel)]):
        if cls.__module__.startswith("pydantic"):
            continue
        body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0]
        assert isinstance(body, ast.ClassDef)
        for field, doc in itertools.pairwise(body.body):
            if (
                isinstance(field, ast.AnnAssign)
                and isinstance(field.target, ast.Name)
                and isinstance(doc, ast.Expr)
                and isinstance(doc.value, ast.Constant)
                and isinstance(doc.value.value, str)
            ):
                found[field.target.id] = inspect.cleandoc(doc.value.value)
    return found


def _without_none(annotation: Any) -> Any:
    members = [a for a in _members(annotation) if a is not types.NoneType]
    return members[0] if len(members) == 1 else annotation


def _members(annotation: Any) -> tuple[Any, ...]:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return typing.get_args(annotation)
    return (annotation,)


def _section_of(annotation: Any) -> type[BaseModel] | None:
    """The model a key holds (a table, or a list of tables), if it holds one."""
    inner = _without_none(annotation)
    if typing.get_origin(inner) is list:
        inner = typing.get_args(inner)[0]
    if isinstance(inner, type) and issubclass(inner, Section | Expect):
        return inner
    return None


def _kind(annotation: Any, metadata: Sequence[Any]) -> tuple[str, list[str]]:
    """The type as the file spells it, and its bounds (`metadata`: the constraints on it)."""
    members = [a for a in _members(annotation) if a is not types.NoneType]
    if len(members) > 1:
        kinds = [_kind(member, ()) for member in members]
        each = [kind if not lim else f"{kind} ({'; '.join(lim)})" for kind, lim in kinds]
        return " or ".join(each), _limits(metadata, "")
    annotation = members[0]
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        inner, *more = typing.get_args(annotation)
        return _kind(inner, [*more, *metadata])
    if origin is typing.Literal:
        values = [f'`"{value}"`' for value in typing.get_args(annotation)]
        kind = f"one of {', '.join(values)}" if len(values) > 1 else values[0]
        return kind, _limits(metadata, "")
    if origin is list:
        kind, each = _kind(typing.get_args(annotation)[0], ())
        limits = _limits(metadata, "items")
        return f"list of {kind}s", [*limits, *(f"each {limit}" for limit in each)]
    if origin is dict:
        (key, keys), (value, values) = (_kind(arg, ()) for arg in typing.get_args(annotation))
        limits = [*(f"keys {k}" for k in keys), *(f"values {v}" for v in values)]
        return f"table of {key} = {value}", [*_limits(metadata, "entries"), *limits]
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "table", _limits(metadata, "")
    kind = _TYPES[annotation]
    return kind, _limits(metadata, "characters" if kind == "string" else "")


def _limits(metadata: Sequence[Any], unit: str) -> list[str]:
    """The bounds `metadata` sets: a range, a length (in `unit`), a pattern, a check."""
    low = high = shortest = longest = None
    found: list[str] = []
    for item in metadata:
        if isinstance(item, FieldInfo):
            found += _limits(item.metadata, unit)
        elif isinstance(item, Ge | Gt):
            low = f"from {item.ge:,}" if isinstance(item, Ge) else f"above {item.gt:,}"
        elif isinstance(item, Le | Lt):
            high = f"to {item.le:,}" if isinstance(item, Le) else f"below {item.lt:,}"
        elif isinstance(item, MinLen):
            shortest = item.min_length
        elif isinstance(item, MaxLen):
            longest = item.max_length
        elif isinstance(item, AfterValidator | PlainValidator):
            found.append(_VALIDATORS[item.func])
        elif getattr(item, "pattern", None):
            found.append(f"matching `{item.pattern}`")
    span = " ".join(part for part in (low, high) if part)
    if shortest is not None and longest is not None:
        length = f"{shortest:,} to {longest:,} {unit}"
    elif shortest is not None:
        length = "not empty" if shortest == 1 else f"at least {shortest:,} {unit}"
    elif longest is not None:
        length = f"at most {longest:,} {unit}"
    else:
        length = ""
    return [part for part in (span, length) if part] + found


def _default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        value: Any = field.default_factory()  # type: ignore[call-arg]
    elif field.default is PydanticUndefined:
        return "required"
    else:
        value = field.default
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, str):
        return f'`"{value}"`'
    if isinstance(value, list | dict):
        return "`[]`" if isinstance(value, list) else "`{}`"
    return f"`{value}`"
