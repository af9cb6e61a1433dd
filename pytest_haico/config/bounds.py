"""The sizes, ranges and name patterns an experiment may have, and the constrained types that
hold them."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Final, Literal

from pydantic import AfterValidator, Field, PlainValidator

from pytest_haico.durations import SLURM_TIME_FORMATS, slurm_limit_seconds
from pytest_haico.errors import ConfigError

SCRIPT_ID = re.compile(r"^[a-z0-9_.-]+$")

# Bounds: generous for any real campaign, small enough that a typo (an extra 000) is
# caught at start instead of hanging collection or failing every item at run time.
# Per experiments directory, all arms: 20,000 items collect in 8 s and 160 MB here.
MAX_ITEMS = 100_000
MAX_REPEATS = 1000
MAX_TURNS = 200
MAX_TURN_CHARS = 200_000  # ~50k tokens: a pasted document, below common context windows
MAX_TAGS = 32
MAX_NAME_CHARS = 128
MAX_GPUS = 16  # one node (the stack runs on one node)
MAX_MODEL_LEN = 10_000_000  # the longest published context windows
MAX_TOKENS = 1_000_000
MAX_RECURSION_LIMIT = 1000
MAX_CONCURRENCY = 1024
# The upper bound of concurrency "auto" when the arm sets no `max_concurrency`: the in-flight
# count the local stack was measured at (issue 23).
DEFAULT_MAX_CONCURRENCY = 16
AUTO: Final = "auto"
MAX_TURN_TIMEOUT_S = 86_400  # a day
MAX_LATENCY_MS = 600_000
MAX_LOAD_S = 3600  # a large model from a shared file system takes tens of minutes
MAX_SEED = 2**32 - 1
MAX_RATE_LIMIT_RPM = 100_000
MAX_CPUS = 1024
MAX_ARM_FILE_BYTES = 1024 * 1024  # an arm is a few dozen keys


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
