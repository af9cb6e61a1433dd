"""The sizes, ranges and name patterns an experiment may have, and the constrained types that
hold them."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, PlainValidator

from pytest_haico.config.limits import (
    AUTO,
    MAX_CONCURRENCY,
    MAX_ITEMS,
    MAX_NAME_CHARS,
)
from pytest_haico.durations import SLURM_TIME_FORMATS, slurm_limit_seconds
from pytest_haico.errors import ConfigError

SCRIPT_ID = re.compile(r"^[a-z0-9_.-]+$")


def not_blank(value: str) -> str:
    """A name or text must say something: "" and whitespace are refused."""
    if not value.strip():
        raise ValueError("must not be empty" if not value else "must not be blank")
    return value


def check_parser_name(value: str) -> str:
    if not value or any(char.isspace() for char in value):
        raise ValueError(
            "must name one of vLLM's tool call parsers (e.g. hermes, mistral, llama3_json)"
        )
    return value


Name = Annotated[str, Field(pattern=SCRIPT_ID.pattern, min_length=1, max_length=MAX_NAME_CHARS)]
Text = Annotated[str, AfterValidator(not_blank)]
ParserName = Annotated[str, AfterValidator(check_parser_name)]
Finite = Field(allow_inf_nan=False)


def check_slurm_time(value: str) -> str:
    try:
        slurm_limit_seconds(value)
    except ValueError:  # the message adds ", got <value>": name the formats only
        raise ValueError(f"not a Slurm time limit: use {SLURM_TIME_FORMATS}") from None
    return value


SlurmTime = Annotated[str, AfterValidator(not_blank), AfterValidator(check_slurm_time)]

ARM_NAME = re.compile(r"^[a-z0-9_.]+(?:-[a-z0-9_.]+)*$")
TAG = re.compile(r"^[a-z_][a-z0-9_]*$")

# Marker names pytest and its usual plugins give a meaning to; a script tag with
# one of these names would silently skip, xfail or parametrise the item.
RESERVED_MARKERS = frozenset(
    {
        "asyncio",
        "filterwarnings",
        "flaky",
        "no_cover",
        "parametrize",
        "skip",
        "skipif",
        "timeout",
        "tryfirst",
        "trylast",
        "usefixtures",
        "xfail",
    }
)


Concurrency = int | Literal["auto"]


def check_concurrency(value: Any) -> Concurrency:
    """An arm's `run.concurrency`: an integer from 1 to MAX_CONCURRENCY, or "auto"."""
    if value == AUTO:
        return AUTO
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_CONCURRENCY:
        return value
    raise ValueError(f'expected an integer from 1 to {MAX_CONCURRENCY} or "auto"')


ArmConcurrency = Annotated[Concurrency, PlainValidator(check_concurrency)]


def check_item_count(root: Path, arms: int, repeats: int) -> None:
    """At most `MAX_ITEMS` items (arms x script repeats) in one experiments directory."""
    items = arms * repeats
    if items > MAX_ITEMS:
        raise ConfigError(
            str(root),
            "",
            f"the campaign has {items} items ({arms} arm{'s' if arms != 1 else ''} x {repeats} "
            f"script repeats); at most {MAX_ITEMS} per experiments directory: lower repeats, "
            "or split the scripts over several experiments directories (--haico-experiments)",
        )
