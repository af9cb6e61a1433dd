"""Items: arm × script × repeat, their ids, shards, per-stratum limits and arm grouping."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from pytest_haico.config.experiment import Arm, Experiments, Script, ScriptSource
from pytest_haico.config.identity import backend_identity, item_id, model_identity
from pytest_haico.config.settings import Settings, Shard
from pytest_haico.errors import ConfigError

_T = TypeVar("_T")


@dataclass(frozen=True)
class ItemSpec:
    """One scripted conversation to run: what a haico item is parametrised with."""

    ordinal: int
    arm: Arm
    source: ScriptSource
    repeat: int
    item_id: str
    model_identity: str
    backend_identity: str

    @property
    def script(self) -> Script:
        return self.source.script

    @property
    def stratum(self) -> str:
        return self.source.script.stratum

    @property
    def test_id(self) -> str:
        return f"{self.arm.name}-{self.script.id}-r{self.repeat}"

    def __repr__(self) -> str:
        return f"<ItemSpec {self.test_id} {self.item_id[:12]}>"


def build_item_specs(
    experiments: Experiments, settings: Settings, *, site_image: str | None = None
) -> list[ItemSpec]:
    """Every item of every arm, in a stable order: arm name, script file order, repeat."""
    specs: list[ItemSpec] = []
    by_id: dict[str, ItemSpec] = {}
    for arm in experiments.arms.values():
        model = model_identity(arm, profile=settings.profile, endpoint=settings.model_endpoint)
        backend = backend_identity(
            arm,
            profile=settings.profile,
            image=settings.backend_image,
            command=settings.backend_cmd,
            site_image=site_image,
        )
        for source in experiments.scripts:
            for repeat in range(source.script.repeats):
                identity = item_id(arm, source.script, repeat, model=model, backend=backend)
                spec = ItemSpec(len(specs), arm, source, repeat, identity, model, backend)
                twin = by_id.get(identity)
                if twin is not None:
                    raise ConfigError(
                        str(source.path),
                        "turns",
                        f"script {source.script.id!r} has the same turns as script "
                        f"{twin.script.id!r} ({twin.source.path}): they would be one experiment "
                        "under two names; change or remove one of them",
                    )
                by_id[identity] = spec
                specs.append(spec)
    return specs


def in_shard(item_id: str, shard: Shard) -> bool:
    """Whether the item belongs to the shard: by its id's hash, so adding items moves none."""
    return int(item_id[:16], 16) % shard.count == shard.index


def first_per_stratum(specs: Iterable[ItemSpec], limit: int) -> set[str]:
    """The item_ids of the first `limit` items (stable order) of each arm × stratum."""
    kept: set[str] = set()
    counts: dict[tuple[str, str], int] = {}
    for spec in sorted(specs, key=lambda s: s.ordinal):
        key = (spec.arm.name, spec.stratum)
        if counts.get(key, 0) < limit:
            counts[key] = counts.get(key, 0) + 1
            kept.add(spec.item_id)
    return kept


def group_by_arm(items: Sequence[_T], arm_of: Callable[[_T], str | None]) -> list[_T]:
    """Reorder so each arm's items run together, where the arm's first item was.

    Items without an arm keep their places relative to the groups; within a group the
    incoming order (random, failed-first, …) is kept.
    """
    slots: list[_T | list[_T]] = []
    groups: dict[str, list[_T]] = {}
    for item in items:
        arm = arm_of(item)
        if arm is None:
            slots.append(item)
        elif arm in groups:
            groups[arm].append(item)
        else:
            groups[arm] = [item]
            slots.append(groups[arm])
    ordered: list[_T] = []
    for slot in slots:
        if isinstance(slot, list):
            ordered.extend(slot)
        else:
            ordered.append(slot)
    return ordered
