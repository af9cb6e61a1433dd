"""Which items this run owes: exact arm and stratum selection, the items file, the shard,
the per-stratum limit, share claims, and resume from the ledgers; and the status line that
says so."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from pytest_haico.config.items import ItemSpec, first_per_stratum, in_shard, limited_shard
from pytest_haico.config.settings import Settings
from pytest_haico.files import shown_path
from pytest_haico.ledger.format import iter_ledger_dir
from pytest_haico.ledger.recorder import ATTEMPT_KEY, ItemAttempt, Recorder
from pytest_haico.ledger.resume import Prior, ResumeIndex
from pytest_haico.ledger.verdicts import Verdict
from pytest_haico.runner.skips import is_skipped_by_marks

_MAX_WARNINGS_SHOWN = 10


@dataclass
class Selection:
    """What collection decided, for the status line and the summary."""

    done: int = 0
    to_run: int = 0
    retries: int = 0  # to run again after an infra failure: each is one more attempt
    resumed: int = 0  # to run again after an interruption, which is no attempt
    skipped_by_marks: int = 0
    out_of_shard: int = 0
    not_listed: int = 0  # not in the --haico-items file
    over_limit: int = 0
    not_selected: int = 0
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # hints on how this run selected items
    # Arm -> its items in this run's scope (arm, stratum, shard, limit), done ones included.
    in_scope: dict[str, list[ItemSpec]] = field(default_factory=dict)
    gated: int = 0  # --haico-gates-only: the items deselected
    # --collect-only: each campaign item kept, with its ledger state (done ones included).
    states: list[tuple[str, str]] = field(default_factory=list)

    @property
    def all_done(self) -> bool:
        """Every item in scope is done in the ledger: this run has nothing to do."""
        return self.done > 0 and not self.to_run and not self.skipped_by_marks

    def all_done_line(self, settings: Settings) -> str:
        """The summary of a run that found every selected item done."""
        in_scope = sum(len(specs) for specs in self.in_scope.values())
        return (
            f"campaign {settings.campaign}: {self.done} of {in_scope} done, results in "
            f"{shown_path(settings.results / settings.campaign)}"
        )

    def status_lines(self, settings: Settings) -> list[str]:
        """The lines pytest prints after collection: ledger warnings, the status, notes."""
        counted = (
            self.to_run
            or self.done
            or self.out_of_shard  # a shard with nothing of its own still says why
            or self.not_selected
            or self.not_listed
            or self.skipped_by_marks
        )
        if not counted and not settings.gates_only:
            return self.notes
        lines = [f"haico: ledger warning: {w}" for w in self.warnings[:_MAX_WARNINGS_SHOWN]]
        if len(self.warnings) > _MAX_WARNINGS_SHOWN:
            lines.append(
                f"haico: ... and {len(self.warnings) - _MAX_WARNINGS_SHOWN} more ledger warnings"
            )
        if settings.gates_only:
            arms = ", ".join(sorted(self.in_scope)) or "none"
            status = (
                f"haico: --haico-gates-only: the gates of arm(s) {arms}; no item runs "
                f"({self.gated} deselected)"
            )
            return [*lines, status, *self.notes]
        if settings.resume:
            again = f"{self.retries} retries"
            if self.resumed:
                again += f", {self.resumed} resumed after interruption"
            status = f"haico: {self.done} done in ledger, {self.to_run} to run ({again})"
        else:
            status = f"haico: resume off (--haico-no-resume), {self.to_run} to run"
        extras = []
        if settings.items is not None:
            extras.append(f"{self.not_listed} not in --haico-items {settings.items.path}")
        if settings.shard.count > 1:
            extras.append(f"shard {settings.shard}: {self.out_of_shard} in other shards")
        if self.over_limit:
            extras.append(f"{self.over_limit} over --haico-limit-per-stratum")
        if self.skipped_by_marks:
            extras.append(f"{self.skipped_by_marks} skipped by marks")
        if extras:
            status += "; " + "; ".join(extras)
        lines.append(status)
        width = max((len(state) for _, state in self.states), default=0)
        lines += [f"haico: {state:<{width}}  {test_id}" for test_id, state in self.states]
        return [*lines, *self.notes]


class Selector:
    """Splits collected items into those this run keeps and those it deselects, counting why."""

    def __init__(self, settings: Settings, recorder: Recorder, selection: Selection) -> None:
        self.settings = settings
        self.recorder = recorder
        self.selection = selection

    def select(
        self,
        items: list[pytest.Item],
        specs: dict[str, ItemSpec],
        *,
        claim: bool,
        listing: bool = False,
    ) -> tuple[list[pytest.Item], list[pytest.Item]]:
        """(kept, deselected); kept campaign items carry their `ItemAttempt` in the stash.

        With `claim`, each arm's shares are claimed before its ledger is read. With
        `listing` (--collect-only), done items are kept too, and every item's ledger state
        goes into the selection's `states`.
        """
        candidates, deselected = self._in_scope(items, specs)
        for item in candidates:
            spec = specs.get(item.nodeid)
            if spec is not None:
                self.selection.in_scope.setdefault(spec.arm.name, []).append(spec)
        if claim:
            self._claim(candidates, specs)
        indexes = self._resume_indexes(
            {specs[i.nodeid].arm.name for i in candidates if i.nodeid in specs}
        )
        selection = self.selection
        keep: list[pytest.Item] = []
        for item in candidates:
            spec = specs.get(item.nodeid)
            if spec is None:
                keep.append(item)
                continue
            index = indexes.get(spec.arm.name)
            prior = index.get(spec.item_id) if index is not None else None
            if listing:
                state = ledger_state(prior) if self.settings.resume else "runs (resume off)"
                selection.states.append((spec.test_id, state))
            if prior is not None and prior.done:
                selection.done += 1
                (keep if listing else deselected).append(item)
                continue
            attempt = prior.next_attempt if prior is not None else 1
            # A skipped item keeps its attempt: should pytest run it after all, it can.
            item.stash[ATTEMPT_KEY] = ItemAttempt(spec=spec, nodeid=item.nodeid, attempt=attempt)
            keep.append(item)
            if is_skipped_by_marks(item):
                selection.skipped_by_marks += 1
                continue
            selection.to_run += 1
            if prior is not None and prior.verdict is Verdict.INTERRUPTED:
                selection.resumed += 1
            elif prior is not None:
                selection.retries += 1
        return keep, deselected

    def _in_scope(
        self, items: list[pytest.Item], specs: dict[str, ItemSpec]
    ) -> tuple[list[pytest.Item], list[pytest.Item]]:
        """Arm and stratum selection, the items file, the shard (by position in the items
        file when there is one, else by item_id), then the per-stratum limit; without an
        items file the limit comes first and its items are dealt over the shards."""
        settings = self.settings
        selection = self.selection
        listed = settings.items
        limit = settings.limit_per_stratum
        dealt = limit is not None and listed is None
        candidates: list[pytest.Item] = []
        deselected: list[pytest.Item] = []
        for item in items:
            spec = specs.get(item.nodeid)
            if spec is None:
                candidates.append(item)
                continue
            position = listed.position(spec.test_id) if listed is not None else None
            if not is_selected(spec, settings):
                selection.not_selected += 1
                deselected.append(item)
            elif listed is not None and position is None:
                selection.not_listed += 1
                deselected.append(item)
            elif not dealt and not (
                listed.in_shard(position, settings.shard)
                if listed is not None and position is not None
                else in_shard(spec.item_id, settings.shard)
            ):
                selection.out_of_shard += 1
                deselected.append(item)
            else:
                candidates.append(item)
        if limit is None:
            return candidates, deselected
        scoped = [specs[i.nodeid] for i in candidates if i.nodeid in specs]
        in_limit = first_per_stratum(scoped, limit)
        mine = limited_shard(scoped, settings.shard, limit) if dealt else in_limit
        within: list[pytest.Item] = []
        for item in candidates:
            spec = specs.get(item.nodeid)
            if spec is None or spec.ordinal in mine:
                within.append(item)
            elif spec.ordinal in in_limit:
                selection.out_of_shard += 1
                deselected.append(item)
            else:
                selection.over_limit += 1
                deselected.append(item)
        return within, deselected

    def _claim(self, candidates: list[pytest.Item], specs: dict[str, ItemSpec]) -> None:
        """Claim each arm's run directory and its shares (arm × shard × stratum) before the
        ledgers are read, so that a run of the same share ending meanwhile is read whole."""
        strata: dict[str, set[str]] = {}
        for item in candidates:
            spec = specs.get(item.nodeid)
            if spec is not None:
                strata.setdefault(spec.arm.name, set()).add(spec.stratum)
        for arm in sorted(strata):
            self.recorder.claim(arm, strata[arm])

    def _resume_indexes(self, arms: set[str]) -> dict[str, ResumeIndex]:
        """One index per arm: arms that differ only outside item identity share item_ids."""
        if not self.settings.resume:
            return {}
        warn = self.selection.warnings.append
        indexes: dict[str, ResumeIndex] = {}
        for arm in sorted(arms):
            index = indexes[arm] = ResumeIndex()
            ledger_dir = self.recorder.paths(arm).ledger_dir
            index.add_all(iter_ledger_dir(ledger_dir, warn=warn, resume_fields=True), warn=warn)
        return indexes


def ledger_state(prior: Prior | None) -> str:
    """What the ledgers say of an item, for --collect-only: `new`, `done (<verdict>)`,
    `owed: retry (attempt N)` after an infra failure, `owed: resume (interrupted)`."""
    if prior is None:
        return "new"
    if prior.done:
        return f"done ({prior.verdict.value})"
    if prior.verdict is Verdict.INTERRUPTED:
        return "owed: resume (interrupted)"
    return f"owed: retry (attempt {prior.next_attempt})"


def is_selected(spec: ItemSpec, settings: Settings) -> bool:
    """--haico-arm and --haico-stratum: exact names, unlike -k's substring match."""
    if settings.arms and spec.arm.name not in settings.arms:
        return False
    return not (settings.strata and spec.stratum not in settings.strata)
