"""JSON values that satisfy a tool's parameter schema, as guided decoding emits, or break it."""

from __future__ import annotations

import logging
import random
import re
from collections.abc import Mapping
from typing import Any

from pytest_haico.standins.regex_values import iter_matching_strings

logger = logging.getLogger(__name__)

Schema = Mapping[str, Any]

# The argument the HAI-Co² tools require and weak models most often leave out.
REASONING_ARGUMENT = "action_and_reasoning"

_FORMAT_EXAMPLES = {
    "date-time": "2024-01-01T00:00:00Z",
    "date": "2024-01-01",
    "time": "00:00:00Z",
    "email": "user@example.com",
    "uri": "https://example.com/",
    "url": "https://example.com/",
    "hostname": "example.com",
    "ipv4": "127.0.0.1",
    "ipv6": "::1",
}
# Deep enough for any real tool schema; stops a self-referencing $ref from recursing forever.
_MAX_DEPTH = 24


def generate_value(schema: Schema, *, rng: random.Random, topic: str, name: str = "value") -> Any:
    """Return a value that validates against *schema*.

    Strings are built from the property *name* and the conversation's *topic*, so a document
    written by a stand-in model still reads like an answer. Covers what pydantic and hand-written
    tool schemas use: ``$ref``/``$defs``, ``anyOf``/``oneOf``/``allOf``, ``enum``/``const``, type
    lists, string length and format, numeric bounds and ``multipleOf``, array bounds and
    ``prefixItems``, and ``pattern`` (a string built from the regular expression itself).
    """
    return _Generator(schema, rng, topic).value(schema, name, 0)


def break_arguments(schema: Schema, arguments: Mapping[str, Any]) -> dict[str, Any]:
    """Return a copy of valid *arguments* that fails *schema*'s validation.

    Drops ``action_and_reasoning`` when it is required (the failure seen from weak models),
    else the first required property, else gives the first property a value of the wrong type.
    """
    broken = dict(arguments)
    resolved = _resolve(schema, schema)
    required = [str(r) for r in resolved.get("required", [])]
    if required:
        broken.pop(REASONING_ARGUMENT if REASONING_ARGUMENT in required else required[0], None)
        return broken
    properties: Mapping[str, Any] = resolved.get("properties", {})
    if properties:
        prop, prop_schema = next(iter(properties.items()))
        types = _types(_resolve(schema, prop_schema))
        broken[prop] = "not-an-object" if "object" in types else {"unexpected": "object"}
    return broken


def _resolve(root: Schema, schema: Schema) -> Schema:
    """Follow local ``$ref`` pointers (``#/$defs/X``, ``#/definitions/X``) to their target."""
    seen = 0
    while "$ref" in schema and seen < _MAX_DEPTH:
        ref = str(schema["$ref"])
        target: Any = root
        for part in ref.removeprefix("#/").split("/") if ref != "#" else []:
            target = target[part.replace("~1", "/").replace("~0", "~")]
        merged = dict(target)
        merged.update({k: v for k, v in schema.items() if k != "$ref"})
        schema = merged
        seen += 1
    return schema


def _types(schema: Schema) -> list[str]:
    declared = schema.get("type")
    if isinstance(declared, str):
        return [declared]
    if isinstance(declared, list):
        return [str(t) for t in declared]
    if "properties" in schema or "required" in schema:
        return ["object"]
    if "items" in schema or "prefixItems" in schema:
        return ["array"]
    return ["string"]


class _Generator:
    def __init__(self, root: Schema, rng: random.Random, topic: str) -> None:
        self._root = root
        self._rng = rng
        self._topic = " ".join(topic.split()) or "the request"

    def value(self, schema: Schema, name: str, depth: int) -> Any:
        if depth > _MAX_DEPTH:
            return None
        schema = _resolve(self._root, schema)
        if "const" in schema:
            return schema["const"]
        if "enum" in schema:
            return self._rng.choice(list(schema["enum"]))
        for key in ("anyOf", "oneOf"):
            if key in schema:
                options = [_resolve(self._root, o) for o in schema[key]]
                # A non-null branch first: guided decoding of "Optional[str]" rarely emits null.
                options.sort(key=lambda o: _types(o) == ["null"])
                return self.value(self._merge(schema, options[0], key), name, depth + 1)
        if "allOf" in schema:
            merged: dict[str, Any] = {k: v for k, v in schema.items() if k != "allOf"}
            for part in schema["allOf"]:
                merged = self._merge(merged, _resolve(self._root, part), None)
            return self.value(merged, name, depth + 1)
        kind = next((t for t in _types(schema) if t != "null"), "null")
        if kind == "object":
            return self._object(schema, depth)
        if kind == "array":
            return self._array(schema, name, depth)
        if kind == "string":
            return self._string(schema, name)
        if kind in ("integer", "number"):
            return self._number(schema, integer=kind == "integer")
        if kind == "boolean":
            return self._rng.random() < 0.5
        return None

    @staticmethod
    def _merge(base: Schema, extra: Schema, drop: str | None) -> dict[str, Any]:
        merged = {k: v for k, v in base.items() if k != drop}
        for key, value in extra.items():
            if key == "properties":
                merged["properties"] = {**merged.get("properties", {}), **value}
            elif key == "required":
                merged["required"] = [*merged.get("required", []), *value]
            else:
                merged[key] = value
        return merged

    def _object(self, schema: Schema, depth: int) -> dict[str, Any]:
        properties: Mapping[str, Any] = schema.get("properties", {})
        result = {prop: self.value(sub, prop, depth + 1) for prop, sub in properties.items()}
        for prop in schema.get("required", []):
            if prop not in result:
                extra = schema.get("additionalProperties")
                sub = extra if isinstance(extra, Mapping) else {"type": "string"}
                result[str(prop)] = self.value(sub, str(prop), depth + 1)
        return result

    def _array(self, schema: Schema, name: str, depth: int) -> list[Any]:
        prefix: list[Any] = list(schema.get("prefixItems", []))
        low = int(schema.get("minItems", 0))
        high = schema.get("maxItems")
        count = max(low, len(prefix), 1)
        if high is not None:
            count = min(count, int(high))
        items = schema.get("items")
        item_schema: Schema = items if isinstance(items, Mapping) else {}
        result = []
        for index in range(count):
            sub = prefix[index] if index < len(prefix) else item_schema
            result.append(self.value(sub, f"{name} {index + 1}", depth + 1))
        return result

    def _string(self, schema: Schema, name: str) -> str:
        fmt = schema.get("format")
        if isinstance(fmt, str) and fmt in _FORMAT_EXAMPLES:
            text = _FORMAT_EXAMPLES[fmt]
        elif fmt == "uuid":
            text = "%08x-%04x-4%03x-8%03x-%012x" % (  # noqa: UP031 - fixed-width hex fields
                self._rng.getrandbits(32),
                self._rng.getrandbits(16),
                self._rng.getrandbits(12),
                self._rng.getrandbits(12),
                self._rng.getrandbits(48),
            )
        else:
            text = f"{name.replace('_', ' ')}: {self._topic}"
        low = int(schema.get("minLength", 0))
        high = schema.get("maxLength")
        if len(text) < low:
            text = (text + " ") * (low // (len(text) + 1) + 1)
        if high is not None:
            text = text[: int(high)]
        pattern = schema.get("pattern")
        if isinstance(pattern, str) and not re.search(pattern, text):
            limit = int(high) if high is not None else None
            fits = (
                c
                for c in iter_matching_strings(pattern)
                if low <= len(c) and (limit is None or len(c) <= limit)
            )
            match = next(fits, None)
            if match is not None:
                return match
            logger.warning("no generated string matches the pattern %r of %r", pattern, name)
        return text

    def _number(self, schema: Schema, *, integer: bool) -> int | float:
        low: float | None = schema.get("minimum")
        high: float | None = schema.get("maximum")
        if "exclusiveMinimum" in schema:
            low = schema["exclusiveMinimum"] + (1 if integer else 1e-6)
        if "exclusiveMaximum" in schema:
            high = schema["exclusiveMaximum"] - (1 if integer else 1e-6)
        if low is None and high is None:
            low, high = 0, 100
        elif low is None:
            low = high - 100 if high is not None else 0
        elif high is None:
            high = low + 100
        assert low is not None and high is not None
        step = schema.get("multipleOf")
        if step:
            first = -(-low // step) * step  # the smallest multiple at or above the minimum
            count = int((high - first) // step)
            value: float = first + step * self._rng.randint(0, max(count, 0))
            return int(value) if integer else value
        if integer:
            return self._rng.randint(int(-(-low // 1)), int(high // 1))
        if high <= low:
            return low
        return min(max(round(self._rng.uniform(low, high), 3), low), high)
