"""Turning pydantic validation errors into one message that names the field and the fix."""

from __future__ import annotations

import types
import typing
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

# What one item of a list field is called in a message; other lists say "<key> item <n>".
_ITEM_NAMES = {"turns": "turn", "tags": "tag"}


class FieldError(ValueError):
    """A cross-field check that names the field it is about (dotted path, list indices as ints
    from 0, as the data has them: `turns.1.branch_from`)."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(problem)
        self.field = field
        self.problem = problem


def describe_validation_error(exc: ValidationError, model: type[BaseModel]) -> tuple[str, str]:
    """The field path and the problem of the first error; further errors are counted."""
    # An unknown key first: it usually explains a "missing" one (a typo in its name).
    errors = sorted(exc.errors(), key=lambda e: e["type"] != "extra_forbidden")
    first = errors[0]
    field, problem = _describe(first, model)
    others = len({_describe(e, model)[0] for e in errors} - {field})
    if others:
        problem += f" (and {others} more problem{'s' if others > 1 else ''})"
    return field, problem


def _describe(error: ErrorDetails, model: type[BaseModel]) -> tuple[str, str]:
    cause = (error.get("ctx") or {}).get("error")
    if isinstance(cause, FieldError):
        inner = [int(part) if part.isdigit() else part for part in cause.field.split(".")]
        return human_field([*_field_parts(error["loc"], model), *inner]), cause.problem
    field = human_field(_field_parts(error["loc"], model))
    kind = error["type"]
    if kind == "extra_forbidden":
        valid = _valid_keys(error["loc"][:-1], model)
        return field, f"unknown key; valid keys here: {', '.join(valid)}"
    if kind == "missing":
        return field, "required, but missing"
    message = error["msg"]
    if kind in ("too_long", "too_short"):
        return field, message  # "List should have at most 200 items ..., not 201"
    if kind == "value_error":
        message = message.removeprefix("Value error, ")
    return field, f"{message}, got {_show(error.get('input'))}"


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def human_field(path: Sequence[str | int]) -> str:
    """A field path as people count, list items from 1: `turns.1.expect.matches` is
    `turn 2, expect.matches`; `vllm.extra_args.0` is `vllm.extra_args item 1`."""
    groups: list[str] = []
    keys: list[str] = []
    for part in path:
        if isinstance(part, int):
            key = keys.pop() if keys else ""
            item = (
                f"{_ITEM_NAMES[key]} {part + 1}" if key in _ITEM_NAMES else f"{key} item {part + 1}"
            )
            groups.append(".".join([*keys, item.strip()]))
            keys = []
        else:
            keys.append(part)
    if keys:
        groups.append(".".join(keys))
    return ", ".join(groups)


def _field_parts(loc: tuple[int | str, ...], model: type[BaseModel]) -> list[int | str]:
    """`turns`, 1, `branch_from` from pydantic's loc, without union and validator tags."""
    parts: list[int | str] = []
    annotation: Any = model
    for component in loc:
        step = _step_into(annotation, component)
        if step is None:
            continue
        annotation = step
        parts.append(component)
    return parts


def _step_into(annotation: Any, component: int | str) -> Any | None:
    """The annotation one level below `annotation` at `component`, or None for a tag."""
    for candidate in _unwrap(annotation):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            if isinstance(component, str) and component in candidate.model_fields:
                return candidate.model_fields[component].annotation
            if isinstance(component, str):
                return object  # an unknown key: keep it, nothing below it is known
        origin = typing.get_origin(candidate)
        if origin in (tuple, list) and isinstance(component, int):
            return typing.get_args(candidate)[0]
        if origin is dict and isinstance(component, str):
            return typing.get_args(candidate)[1]
    return None


def _unwrap(annotation: Any) -> list[Any]:
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _unwrap(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return [inner for arg in typing.get_args(annotation) for inner in _unwrap(arg)]
    return [annotation]


def _valid_keys(loc: tuple[int | str, ...], model: type[BaseModel]) -> list[str]:
    annotation: Any = model
    for component in loc:
        step = _step_into(annotation, component)
        if step is not None:
            annotation = step
    for candidate in _unwrap(annotation):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return [name for name in candidate.model_fields if name != "name"]
    return []
