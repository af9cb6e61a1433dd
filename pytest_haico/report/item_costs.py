"""What a campaign's ledgers measured per arm × stratum: item times (median, p95, max, the
trend against item order) and how many items are done, read fast enough for 100,000
records."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_haico.errors import HaicoError
from pytest_haico.ledger.format import Warn, iter_ledger, leading_fields_pattern, sound_leading
from pytest_haico.ledger.layout import ArmPaths, iter_arm_dirs
from pytest_haico.ledger.verdicts import MEASURED_VERDICTS, Verdict
from pytest_haico.percentiles import P95, nearest_rank
from pytest_haico.report.run_startup import run_startup_s

if TYPE_CHECKING:  # the readers of the results import no pydantic (tests/ledger)
    from pytest_haico.config.items import ItemSpec


class CostError(HaicoError):
    """The costs cannot be read: the campaign directory is missing or has no ledgers."""


# The fields the cost needs, all among a line's leading fields: matching them is 5x faster
# than a JSON parse of the line. Any other line (torn, hand-edited, another shape, another
# schema) takes the ledger reader's parse.
_COST_FIELDS = leading_fields_pattern(
    "stratum", "item_id", "repeat", "verdict", "started_at", "finished_at", "duration_s"
)


@dataclass(frozen=True)
class StratumCost:
    """Measured item times of one arm × stratum; figures are None when nothing was measured.

    `n` counts measured attempts (a verdict in `MEASURED_VERDICTS`, a finite duration);
    `done` the distinct items whose newest record is terminal (as resume decides); `stale`
    the distinct items whose records are not counted at all: their ids are no longer among
    the current items (their script or arm changed since they ran).
    Early and late means are over the first and last third of the items by start time
    (None below 3 items).
    """

    arm: str
    stratum: str
    n: int
    median_s: float | None
    p95_s: float | None
    max_s: float | None
    mean_s: float | None
    early_mean_s: float | None
    late_mean_s: float | None
    done: int
    # The arm's longest measured stack start-up (claim of the run directory to the first
    # item's start: the stack and the gates), None when no run recorded one.
    startup_s: float | None = None
    stale: int = 0

    @property
    def trend(self) -> float | None:
        """late/early: the factor by which the early mean underestimates the late one."""
        if self.early_mean_s is None or self.late_mean_s is None or self.early_mean_s <= 0:
            return None
        return self.late_mean_s / self.early_mean_s

    @property
    def per_item_s(self) -> float:
        """The cost to project with: the larger of the mean and the late-third mean."""
        return max(self.mean_s or 0.0, self.late_mean_s or 0.0)

    @classmethod
    def from_times(
        cls,
        arm: str,
        stratum: str,
        times: list[tuple[bytes, float]],
        done: int,
        *,
        startup_s: float | None = None,
        stale: int = 0,
    ) -> StratumCost:
        """From (started_at, duration_s) pairs of the measured attempts."""
        n = len(times)
        if not n:
            return cls(arm, stratum, 0, None, None, None, None, None, None, done, startup_s, stale)
        # ISO 8601 UTC timestamps as the recorder writes them sort as text.
        in_order = [duration for _, duration in sorted(times)]
        ranked = sorted(in_order)
        third = n // 3
        return cls(
            arm,
            stratum,
            n,
            median_s=statistics.median(ranked),
            p95_s=nearest_rank(ranked, P95),  # as the walltime gate's ItemTimes
            max_s=ranked[-1],
            mean_s=statistics.fmean(in_order),
            early_mean_s=statistics.fmean(in_order[:third]) if third else None,
            late_mean_s=statistics.fmean(in_order[-third:]) if third else None,
            done=done,
            startup_s=startup_s,
            stale=stale,
        )


_MEASURED = frozenset(verdict.value.encode() for verdict in MEASURED_VERDICTS)
_TERMINAL = frozenset(verdict.value.encode() for verdict in Verdict if verdict.is_terminal)
_KNOWN_TEXT = frozenset(verdict.value for verdict in Verdict)
_KNOWN = frozenset(verdict.encode() for verdict in _KNOWN_TEXT)


class _ArmTally:
    """One arm's measured times per stratum and each item's newest record, kept as the
    ledger's bytes (decoding 100,000 lines' fields would double the time).

    With `current` (item_id -> stratum of the arm's current items), a record of any other
    item_id only counts as stale, and a current item counts in its current stratum (a
    script's stratum is no part of its items' ids)."""

    def __init__(self, current: Mapping[bytes, bytes] | None = None) -> None:
        self.current = current
        # stratum -> the item_ids of its records that are not current
        self.stale: dict[bytes, set[bytes]] = {}
        self.times: dict[bytes, list[tuple[bytes, float]]] = {}
        # item_id -> (finished_at, terminal, stratum) of its newest record
        self.newest: dict[bytes, tuple[bytes, bool, bytes]] = {}
        # run_id (a ledger file's stem) -> the started_at of its first item
        self.first_start: dict[str, bytes] = {}
        self._run = ""

    def read(self, path: Path, *, warn: Warn) -> None:
        """Count the records of one ledger file, in line order: lines of the package's own
        shape are matched here, every other one is parsed by the ledger reader, with its
        warnings and line numbers."""
        self._run = path.stem
        for record in iter_ledger(path, warn=warn, consumed=self._consume):
            self.add_data(record.data, f"{path}:{record.line}", warn)

    def _consume(self, raw: bytes) -> bool:
        """Count a whole line `_COST_FIELDS` matches; False leaves it to the reader."""
        fields = _COST_FIELDS.match(raw)
        # A damaged repeat or duration_s is left to the reader, which skips the line.
        if fields is None or fields[4] not in _KNOWN or not sound_leading(fields[3], fields[7]):
            return False
        stratum, item_id, _, verdict, started, finished, duration = fields.groups()
        seconds = None if duration == b"null" else float(duration)
        self._count(stratum, item_id, verdict, started, finished, seconds)
        return True

    def add_data(self, data: dict[str, Any], where: str, warn: Warn) -> None:
        """Count a record the reader parsed: the same fields, checked one by one."""
        text = [data.get(key) for key in ("stratum", "item_id", "verdict")]
        text += [data.get("started_at"), data.get("finished_at")]
        duration: object = data.get("duration_s")
        if not all(isinstance(value, str) for value in text) or text[2] not in _KNOWN_TEXT:
            warn(f"{where}: skipped a record without a valid stratum, item_id, verdict or times")
            return
        stratum, item_id, verdict, started, finished = (
            str(value).encode(errors="surrogatepass") for value in text
        )
        seconds = None
        if isinstance(duration, int | float) and not isinstance(duration, bool):
            seconds = float(duration)
        self._count(stratum, item_id, verdict, started, finished, seconds)

    def _count(
        self,
        stratum: bytes,
        item_id: bytes,
        verdict: bytes,
        started: bytes,
        finished: bytes,
        seconds: float | None,
    ) -> None:
        first = self.first_start.get(self._run)
        if first is None or started < first:
            self.first_start[self._run] = started
        if self.current is not None:
            now = self.current.get(item_id)
            if now is None:
                self.stale.setdefault(stratum, set()).add(item_id)
                return
            stratum = now
        if verdict in _MEASURED and seconds is not None and 0 <= seconds < math.inf:
            self.times.setdefault(stratum, []).append((started, seconds))
        known = self.newest.get(item_id)
        # As ResumeIndex: later lines win ties (files in run order, lines in write order).
        if known is None or finished >= known[0]:
            self.newest[item_id] = (finished, verdict in _TERMINAL, stratum)

    def startup_s(self, arm_dir: Path) -> float | None:
        """The longest stack start-up of the arm's runs (`run_startup_s`); None when no run
        says."""
        measured = [
            seconds
            for run_id, first in self.first_start.items()
            if (seconds := run_startup_s(ArmPaths(arm_dir).run_dir(run_id), first.decode()))
            is not None
        ]
        return max(measured) if measured else None

    def costs(self, arm: str, arm_dir: Path) -> Iterator[StratumCost]:
        startup = self.startup_s(arm_dir)
        done: dict[bytes, int] = {}
        for _, terminal, stratum in self.newest.values():
            done[stratum] = done.get(stratum, 0) + terminal
        for stratum in sorted(self.times.keys() | done.keys() | self.stale.keys()):
            name = stratum.decode(errors="replace")
            times = self.times.get(stratum, [])
            stale = len(self.stale.get(stratum, ()))
            yield StratumCost.from_times(
                arm, name, times, done.get(stratum, 0), startup_s=startup, stale=stale
            )


def current_items(specs: Iterable[ItemSpec]) -> dict[str, dict[str, str]]:
    """Arm -> item id -> stratum of the items `specs` gives: what `load_costs` counts."""
    current: dict[str, dict[str, str]] = {}
    for spec in specs:
        current.setdefault(spec.arm.name, {})[spec.item_id] = spec.stratum
    return current


def load_costs(
    campaign_dir: Path,
    *,
    warn: Warn,
    current: Mapping[str, Mapping[str, str]] | None = None,
) -> dict[tuple[str, str], StratumCost]:
    """Every arm × stratum measured in `<campaign>/<arm>/ledger/*.jsonl`, keyed (arm, stratum).

    `current` maps an arm to its current items (item_id -> stratum, as `build_item_specs`
    gives them): only their records are counted (done, and measured), in their current
    stratum; the others are `stale`. An arm it does not name has every record counted.

    Lines the ledger reader skips are reported through `warn` with file and line. A
    missing campaign directory, or one without ledgers yet, is a `CostError`.
    """
    if not campaign_dir.is_dir():
        what = "does not exist" if not campaign_dir.exists() else "is not a directory"
        raise CostError(
            f"the campaign directory {campaign_dir} {what}: give <results>/<campaign>, the "
            "directory holding one <arm>/ledger/ per arm"
        )
    try:
        arms = [ArmPaths(arm) for arm in iter_arm_dirs(campaign_dir)]
        files = [
            (arm.root.name, arm.ledger_dir / name) for arm in arms for name in arm.ledger_names()
        ]
    except OSError as exc:
        raise CostError(
            f"cannot list the campaign directory {campaign_dir}: [Errno {exc.errno}] "
            f"{exc.strerror}: make it readable for this user"
        ) from exc
    if not files:
        raise CostError(
            f"no ledgers yet under {campaign_dir} (<arm>/ledger/*.jsonl): run the smoke stage "
            "first (haico submit <campaign> --stage smoke), then ask again"
        )
    tallies: dict[str, _ArmTally] = {}
    for arm, path in files:
        if arm not in tallies:
            items = current.get(arm) if current is not None else None
            ids = None if items is None else {k.encode(): v.encode() for k, v in items.items()}
            tallies[arm] = _ArmTally(ids)
        tallies[arm].read(path, warn=warn)
    return {
        (cost.arm, cost.stratum): cost
        for arm, tally in tallies.items()
        for cost in tally.costs(arm, campaign_dir / arm)
    }
