"""--haico-items: a file listing the items a run owes (test ids, one per line), and the run's
shard of it by position, which splits exactly those items over the tasks of an array."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_haico.errors import ConfigError

if TYPE_CHECKING:
    from pytest_haico.config.shard import Shard

_FORMAT = "test ids such as qwen32b-plan-trip-r0 (<arm>-<script id>-r<repeat>), one per line"


@dataclass(frozen=True)
class ItemList:
    """The test ids an items file lists, in file order, and the line each is on."""

    path: Path
    test_ids: tuple[str, ...]
    lines: tuple[int, ...]

    def __str__(self) -> str:
        return f"{len(self.test_ids)} ids listed in {self.path} (list {self.key})"

    @cached_property
    def _positions(self) -> dict[str, int]:
        return {test_id: k for k, test_id in enumerate(self.test_ids)}

    def position(self, test_id: str) -> int | None:
        """Where the file lists `test_id` (0 for the first id), or None if it does not."""
        return self._positions.get(test_id)

    def in_shard(self, position: int, shard: Shard) -> bool:
        """The k-th listed item belongs to shard k mod N: N tasks split the list exactly,
        whatever the items' ids."""
        return position % shard.count == shard.index

    @cached_property
    def key(self) -> str:
        """12 hex digits naming this list (its ids in order): runs of one list share claims."""
        return hashlib.sha256("\n".join(self.test_ids).encode()).hexdigest()[:12]

    def check_known(self, known: Iterable[str], experiments: Path) -> None:
        """Every listed id is an item of the experiments, or a `ConfigError` naming its line."""
        known = set(known)
        for test_id, line in zip(self.test_ids, self.lines, strict=True):
            if test_id not in known:
                raise ConfigError(
                    f"{self.path}:{line}",
                    "",
                    f"{test_id!r} is no item of the experiments in {experiments} "
                    "(test ids are <arm>-<script id>-r<repeat>, as pytest --collect-only -q "
                    "shows them in brackets): fix or remove the line, or give the "
                    "experiments the list was written for (--haico-experiments)",
                )


def parse_item_list(path: Path) -> ItemList:
    """The ids `path` lists; blank lines and `#` comments are skipped. An unreadable file,
    one that lists nothing, or an id listed twice is a `ConfigError` naming file and line."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(
            f"--haico-items {path}",
            "",
            f"cannot be read: {exc.strerror or exc}; give a readable file of {_FORMAT}",
        ) from None
    test_ids: list[str] = []
    lines: list[int] = []
    first: dict[str, int] = {}
    for number, raw in enumerate(data.split(b"\n"), start=1):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ConfigError(
                f"{path}:{number}", "", f"not UTF-8 text; --haico-items takes {_FORMAT}"
            ) from None
        test_id = text.partition("#")[0].strip()
        if not test_id:
            continue
        if test_id in first:
            raise ConfigError(
                f"{path}:{number}",
                "",
                f"{test_id!r} is listed twice (also on line {first[test_id]}): list each "
                "item once, or the shards by position would run it twice",
            )
        first[test_id] = number
        test_ids.append(test_id)
        lines.append(number)
    if not test_ids:
        raise ConfigError(
            f"--haico-items {path}",
            "",
            f"lists no item (only blank lines and # comments); list {_FORMAT}, or leave "
            "out --haico-items to run every item",
        )
    return ItemList(path=path, test_ids=tuple(test_ids), lines=tuple(lines))
