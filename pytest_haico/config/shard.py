"""A run's share of the items: task `index` of `count` (`--haico-shard I/N`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pytest_haico.errors import ConfigError


@dataclass(frozen=True)
class Shard:
    """Task `index` of `count`: the items whose item_id falls in this share."""

    index: int
    count: int

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def parse_shard(value: Any, source: str) -> Shard:
    """`I/N` with 0 <= I < N."""
    text = str(value).strip()
    index_text, slash, count_text = text.partition("/")
    try:
        index, count = int(index_text), int(count_text)
    except ValueError:
        index, count = -1, 0
    if not slash or count < 1 or index < 0:
        raise ConfigError(
            source, "", f"invalid shard {text!r}; expected I/N with 0 <= I < N, e.g. 0/4"
        )
    if index >= count:
        raise ConfigError(
            source,
            "",
            f"invalid shard {text!r}: the index must be below N (0..{count - 1}); shards "
            "count from 0",
        )
    return Shard(index, count)
