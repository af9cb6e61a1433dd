"""Items: arm × script × repeat, their ids, shards, per-stratum limits, arm grouping, and
what to say when a run selects or collects them other than meant."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar

from pytest_haico.config.experiment import Arm, Experiments, Script, ScriptSource
from pytest_haico.config.identity import (
    SourceTree,
    backend_identity,
    item_id,
    model_identity,
)
from pytest_haico.config.settings import Profile
from pytest_haico.config.shard import Shard
from pytest_haico.errors import ConfigError

_T = TypeVar("_T")

ITEM_FIXTURES = ("haico_conversation", "haico_item")
# The demo's experiments/test_conversations.py, without its docstring.
ITEM_MODULE = (
    "    from pytest_haico import Conversation, Verdict\n"
    "\n"
    "    def test_conversation(haico_conversation: Conversation) -> None:\n"
    "        assert haico_conversation.verdict is Verdict.COMPLETED, haico_conversation.explain()"
)
_K_WORD = re.compile(r"[\w.-]+")


@dataclass(frozen=True, kw_only=True)
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


class IdentityInputs(Protocol):
    """What of a run's settings enters its items' identity (`Settings` has it; so does what
    the `haico` command knows of a submission)."""

    @property
    def profile(self) -> Profile: ...
    @property
    def model_endpoint(self) -> str | None: ...
    @property
    def backend_image(self) -> str | None: ...
    @property
    def backend_cmd(self) -> str | None: ...


def build_item_specs(
    experiments: Experiments,
    settings: IdentityInputs,
    *,
    site_image: str | None = None,
    backend_tree: SourceTree | None = None,
) -> list[ItemSpec]:
    """Every item of every arm, in a stable order: arm name, script file order, repeat."""
    specs: list[ItemSpec] = []
    for arm in experiments.arms.values():
        # Per arm: two arms that differ only outside item identity (say run.concurrency)
        # share item_ids, and each keeps its own ledger.
        by_id: dict[str, ItemSpec] = {}
        model = model_identity(arm, profile=settings.profile, endpoint=settings.model_endpoint)
        backend = backend_identity(
            arm,
            profile=settings.profile,
            image=settings.backend_image,
            command=settings.backend_cmd,
            tree=backend_tree,
            site_image=site_image,
        )
        for source in experiments.scripts:
            for repeat in range(source.script.repeats):
                identity = item_id(arm, source.script, repeat, model=model, backend=backend)
                spec = ItemSpec(
                    ordinal=len(specs),
                    arm=arm,
                    source=source,
                    repeat=repeat,
                    item_id=identity,
                    model_identity=model,
                    backend_identity=backend,
                )
                twin = by_id.get(identity)
                if twin is not None:
                    raise ConfigError(
                        source.where,
                        "turns",
                        f"script {source.script.id!r} has the same turns and expectations as "
                        f"script {twin.script.id!r} ({twin.source.where}): one experiment under "
                        "two names; change or remove one of them",
                    )
                by_id[identity] = spec
                specs.append(spec)
    return specs


@dataclass(frozen=True)
class _NoOverrides:
    profile: Profile
    model_endpoint: str | None = None
    backend_image: str | None = None
    backend_cmd: str | None = None


def submitted_item_specs(
    experiments: Experiments, profile: Profile, *, site_image: str | None
) -> list[ItemSpec]:
    """The items with the ids a `haico submit` job gives them: its profile and the site's
    backend image, no endpoint, image or command override (haico submit passes none)."""
    return build_item_specs(experiments, _NoOverrides(profile), site_image=site_image)


def in_shard(item_id: str, shard: Shard) -> bool:
    """Whether the item belongs to the shard: by its id's hash, so adding items moves none."""
    return int(item_id[:16], 16) % shard.count == shard.index


def first_per_stratum(specs: Iterable[ItemSpec], limit: int) -> set[int]:
    """The ordinals of the first `limit` items (stable order) of each arm × stratum.

    Ordinals, not item_ids: two arms may share item_ids.
    """
    kept: set[int] = set()
    counts: dict[tuple[str, str], int] = {}
    for spec in sorted(specs, key=lambda s: s.ordinal):
        key = (spec.arm.name, spec.stratum)
        if counts.get(key, 0) < limit:
            counts[key] = counts.get(key, 0) + 1
            kept.add(spec.ordinal)
    return kept


def limited_shard(specs: Iterable[ItemSpec], shard: Shard, limit: int) -> set[int]:
    """The ordinals a task runs under a per-stratum limit: the first `limit` items (stable
    order) of each arm × stratum, dealt in turn over the shards, so that an array of n tasks
    runs `limit` items of each in all, not n × limit."""
    ordered = sorted(specs, key=lambda s: s.ordinal)
    chosen = first_per_stratum(ordered, limit)
    kept: set[int] = set()
    dealt: dict[tuple[str, str], int] = {}
    for spec in ordered:
        if spec.ordinal not in chosen:
            continue
        key = (spec.arm.name, spec.stratum)
        turn = dealt.get(key, 0)
        dealt[key] = turn + 1
        if turn % shard.count == shard.index:
            kept.add(spec.ordinal)
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


def has_item_module(root: Path) -> bool:
    """Whether a test module under `root` mentions haico_conversation or haico_item: a text
    search, enough to tell "not written yet" from "not collected by this run"."""
    for path in root.rglob("*.py"):
        if not (path.name.startswith("test_") or path.name.endswith("_test.py")):
            continue
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        if any(name in text for name in ITEM_FIXTURES):
            return True
    return False


def describe_missing_item_module(root: Path, *, nothing_collected: bool) -> str:
    """What to write when no test asks for the items (several lines)."""
    module = root / "test_conversations.py"
    if nothing_collected:
        head = (
            f"{root}: no test module asks for haico_conversation, so the campaign has no "
            f"items; write {module}:"
        )
    else:
        head = (
            f"no campaign item was collected: no test module in {root} asks for "
            f"haico_conversation; to run the campaign, write {module} and run pytest {root}:"
        )
    return f"{head}\n\n{ITEM_MODULE}"


def describe_k_beyond_arms(
    expression: str, every: Iterable[ItemSpec], selected: Iterable[ItemSpec]
) -> str | None:
    """`-k <arm>` is a substring match on test ids and tags: when it also picked other arms'
    items, say so and name the exact option; None when it picked what it names."""
    words = set(_K_WORD.findall(expression))
    if not words or "not" in words:  # a negated arm name selects the others on purpose
        return None
    named = sorted(words & {spec.arm.name for spec in every})
    others = sorted({spec.arm.name for spec in selected} - set(named))
    if not named or not others:
        return None
    exact = " ".join(f"--haico-arm {arm}" for arm in named)
    return (
        f"-k {expression} also selected items of arm{'s' if len(others) > 1 else ''} "
        f"{', '.join(others)}: -k matches substrings of test ids and script tags; "
        f"select exact arms with {exact}"
    )
