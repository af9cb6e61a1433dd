"""Which nodes a submission's infrastructure failures cluster on, and the nodes `haico
continue` therefore keeps its reruns off (`sbatch --exclude`).

One failed task in an otherwise healthy array is usually the node, not the campaign. Every
attempt at a share is a `Placement`: the node it ran on and whether the node failed it
there — Slurm's NODE_FAIL or BOOT_FAIL, a run whose records are mostly infrastructure
failures (model or backend unreachable, the breaker), or a gate that failed on it and passed
on another node for the same arm. A node is blamed when `BLAME_AFTER` attempts failed there
while attempts of the same arm recorded items on another node (so the campaign itself
works). Exclusions accumulate over a submission's rounds (each continuation's plan records
its `exclude`, in the journal), and never take every node of a partition: that stops, naming
the nodes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

# Attempts failed on one node, at least, before it is excluded: "several tasks' failures",
# never a single one (which a rerun elsewhere answers).
BLAME_AFTER = 2
# Slurm's own word that the node failed the job.
NODE_STATES = frozenset({"NODE_FAIL", "BOOT_FAIL"})


@dataclass(frozen=True)
class Placement:
    """One run (or one Slurm attempt that left no run) of a share: where, and how it went."""

    arm: str
    attempt: str  # ``<job id>_<task>``, plus ``r<n>`` for a requeue
    node: str | None
    failure: str | None = None  # how the node failed it ("NODE_FAIL"); None: it did not
    fruitful: bool = False  # it recorded terminal items
    passed_gates: frozenset[str] = frozenset()
    failed_gate: str | None = None


@dataclass(frozen=True)
class Blame:
    """A node the infrastructure failures cluster on."""

    node: str
    failures: tuple[str, ...]  # each failed attempt's "<attempt>: <how>"
    elsewhere: int  # attempts of the same arms that recorded items on other nodes

    @property
    def text(self) -> str:
        return (
            f"{len(self.failures)} attempts failed there: {'; '.join(self.failures)}; "
            f"{self.elsewhere} attempt{'s' if self.elsewhere != 1 else ''} of the same arm "
            "recorded items on other nodes"
        )


def gate_passed_elsewhere(placement: Placement, placements: Iterable[Placement]) -> str | None:
    """The nodes on which the gate that failed `placement` passed for the same arm, as text;
    None when it failed nowhere else's way (or `placement` failed no gate, or its node is
    unknown)."""
    gate, node = placement.failed_gate, placement.node
    if gate is None or node is None:
        return None
    others = sorted(
        {
            p.node
            for p in placements
            if p.arm == placement.arm and p.node not in (None, node) and gate in p.passed_gates
        }
        - {None}
    )
    return ", ".join(str(n) for n in others) or None


def blame(placements: Sequence[Placement]) -> dict[str, Blame]:
    """The nodes on which at least `BLAME_AFTER` attempts failed by the node while attempts
    of the same arms recorded items elsewhere."""
    failed: dict[str, dict[str, tuple[str, str]]] = {}  # node -> attempt -> (arm, how)
    for placement in placements:
        how = placement.failure
        if how is None and (passed := gate_passed_elsewhere(placement, placements)):
            how = f"gate {placement.failed_gate} failed (passed on {passed})"
        if how is not None and placement.node is not None:
            failed.setdefault(placement.node, {})[placement.attempt] = (placement.arm, how)
    blamed = {}
    for node, failures in failed.items():
        arms = {arm for arm, _ in failures.values()}
        elsewhere = sum(
            1 for p in placements if p.fruitful and p.arm in arms and p.node not in (None, node)
        )
        attempts = {attempt: how for attempt, (_, how) in failures.items()}
        if len(attempts) >= BLAME_AFTER and elsewhere:
            texts = tuple(f"{attempt}: {how}" for attempt, how in attempts.items())
            blamed[node] = Blame(node, texts, elsewhere)
    return blamed


@dataclass(frozen=True)
class Exclusions:
    """The nodes this round's reruns stay off: those excluded in earlier rounds and those
    blamed now (with why)."""

    earlier: tuple[str, ...]
    blamed: Mapping[str, Blame]

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(sorted({*self.earlier, *self.blamed}))

    def why(self, node: str | None) -> str | None:
        """Why the reruns avoid `node`; None when they do not."""
        if node is None:
            return None
        if node in self.blamed:
            return f"node {node} excluded ({len(self.blamed[node].failures)} attempts failed there)"
        if node in self.earlier:
            return f"node {node} excluded in an earlier round"
        return None

    def leaves_nothing(self, nodes: Sequence[str]) -> bool:
        """Whether excluding these would leave no node of `nodes` (a partition's) to run on."""
        return bool(nodes) and set(nodes) <= set(self.nodes)

    def text(self) -> str:
        return ", ".join(
            f"{n} ({self.blamed[n].text})" if n in self.blamed else f"{n} (an earlier round)"
            for n in self.nodes
        )
