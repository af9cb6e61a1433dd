"""The decision table of `haico continue`: what becomes of a share, by how its newest attempt
ended in Slurm and what the ledgers say it still owes (docs/submit.md "Continue"; DESIGN
"Continuation decides by what the ledgers owe"). The one place these rules live."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from pytest_haico.slurm.records import LAUNCH_HELD, TaskState

# The walltime gate's name (gates.static.WALLTIME; a test pins that they agree). Its refusal
# is a cost shortfall (less time left than an item costs), not a change of meaning.
WALLTIME_GATE = "walltime"
# The last gate before the items (runner.stack_gates, pinned by a test): a run that passed it
# had its stack up and answering, and went on to its conversations.
LAST_GATE = "canary_turn"
DEFAULT_MAX_ROUNDS = 5
# End states in which the infrastructure cut the job short, whatever its exit code.
_INFRA_STATES = {
    "TIMEOUT": "out of walltime",
    "PREEMPTED": "preempted",
    "NODE_FAIL": "its node failed",
    "BOOT_FAIL": "its node failed to boot",
}
# A batch job killed by a signal: Slurm's "0:<signal>", or the shell's 128 + signal.
_SIGNALS = {9: "SIGKILL", 15: "SIGTERM"}


class Action(enum.StrEnum):
    """What `haico continue` does with a share."""

    DONE = "done"  # nothing owed
    WAIT = "wait"  # pending or running, or waiting for its dependency: never resubmitted
    RERUN = "rerun"  # the infrastructure cut it short: resubmitted
    HOLD = "hold"  # cancelled: rerun only with --include-cancelled
    STOP = "stop"  # terminal: a person must act, the reason says how

    @property
    def needs_a_person(self) -> bool:
        return self in (Action.HOLD, Action.STOP)


@dataclass(frozen=True)
class GateFailure:
    """The gate that failed in a run's gates.json, and its fix."""

    name: str
    detail: str
    fix: str


@dataclass(frozen=True)
class RunGates:
    """What an attempt's newest gates.json says: its failed gate, and the gates it passed."""

    failure: GateFailure | None
    passed: frozenset[str] = frozenset()

    @property
    def reached_items(self) -> bool:
        return LAST_GATE in self.passed


def had_its_chance(end: TaskState | None, gates: RunGates | None) -> bool:
    """Whether an attempt that recorded nothing terminal counts against its share's
    `--max-rounds`: it ran out of its own walltime, the walltime gate refused it (its
    allocation was shorter than an item), or it reached its conversations and finished none.
    One cut short before that (a signal, an scancel, a preemption or a node failure while
    its stack started, or Slurm never started it) says nothing of the share itself."""
    if end is not None and end.state == "TIMEOUT":
        return True
    if gates is None:
        return False
    failure = gates.failure
    return gates.reached_items or (failure is not None and failure.name == WALLTIME_GATE)


@dataclass(frozen=True)
class Dependency:
    """Why a share never started: Slurm cancelled it because a job it waited for failed.
    `done`: the shares of that job are done now; `detail` says which they are."""

    done: bool
    detail: str


@dataclass(frozen=True)
class Evidence:
    """What is known of a share's newest attempt."""

    end: TaskState | None  # None: Slurm no longer knows the task
    owed: int  # items of its frozen selection without a terminal record
    # attempts in a row, this one included, that had their chance and recorded nothing
    # terminal (`had_its_chance`)
    stalled: int = 0
    gate: GateFailure | None = None  # the failed gate of its newest run, when it exited 78
    dependency: Dependency | None = None
    log: str = ""  # the job's log, for the reasons that send the user to it
    node: str | None = None  # the node it ran on, where known
    # The nodes on which `gate` passed for the same arm: then the node failed it, not the
    # campaign (one failed task in an otherwise healthy array).
    gate_passed_on: str | None = None


@dataclass(frozen=True)
class Rules:
    """The user's say in the table: rerun cancelled shares; how many fruitless attempts in a
    row a share may have before it stops (each one costs an allocation and a stack start)."""

    include_cancelled: bool = False
    max_rounds: int = DEFAULT_MAX_ROUNDS


@dataclass(frozen=True)
class Decision:
    action: Action
    reason: str


def decide(evidence: Evidence, rules: Rules) -> Decision:
    """The table, first matching row wins (docs/submit.md "Continue" lists it the same way)."""
    end, owed, log = evidence.end, evidence.owed, evidence.log
    if end is not None and end.launch_held:
        where = f" on {end.node}" if end.node else ""
        held = f"held by Slurm, its launch failed{where} ({LAUNCH_HELD})"
        if owed == 0:
            return Decision(Action.DONE, "done")  # and the held task cancelled
        return _rerun(
            f"{held}: it never starts by itself, so it is cancelled and rerun", evidence, rules
        )
    if end is not None and not end.final:
        return Decision(Action.WAIT, f"{end.state.lower()}, not resubmitted")
    if owed == 0:
        return Decision(Action.DONE, "done")
    if end is None:
        return Decision(
            Action.STOP,
            "Slurm keeps no record of how it ended (no accounting, no job completion log, "
            f"and the controller forgot it): read its log {log}, then rerun it with "
            "--include-cancelled if it was cut short",
        )
    infrastructure = _infrastructure(end, evidence)
    if infrastructure is not None:
        return _rerun(infrastructure, evidence, rules)
    status = _status(end)
    if end.state == "CANCELLED":
        return _cancelled(evidence, rules)
    if end.state == "COMPLETED":
        return Decision(
            Action.STOP,
            f"inconsistent: it ended COMPLETED, yet {owed} of its items have no terminal "
            f"record; read its log {log} (are the ledgers where the job wrote them?)",
        )
    if status == 78:
        gate = evidence.gate
        if gate is None:
            return Decision(
                Action.STOP,
                "exit 78 with no failed gate in its gates.json: the stack failed before the "
                f"first item; read its log {log} and the run's logs/",
            )
        fix = f"; {gate.fix}" if gate.fix else ""
        return Decision(Action.STOP, f"gate {gate.name} failed: {gate.detail}{fix}")
    if status == 4:
        return Decision(
            Action.STOP, f"a usage error (exit 4): read its log {log}; fix it in a new submission"
        )
    if end.state == "OUT_OF_MEMORY":
        return Decision(
            Action.STOP,
            f"out of memory: raise the arm's [slurm] mem (a new submission); its log {log}",
        )
    return Decision(Action.STOP, f"ended {end.text}, which no rule reruns: read its log {log}")


def _infrastructure(end: TaskState, evidence: Evidence) -> str | None:
    """Why the infrastructure, not the share, ended the attempt; None when it did not."""
    if end.state in _INFRA_STATES:
        return _INFRA_STATES[end.state]
    if end.state != "FAILED":
        return None
    status, signal, gate = _status(end), _signal(end), evidence.gate
    if status == 75:
        return "exit 75: drained, or items owed a retry"
    if status == 78 and gate is not None and gate.name == WALLTIME_GATE:
        return "the walltime gate: less time left than an item costs"
    if status == 78 and gate is not None and evidence.gate_passed_on:
        return (
            f"gate {gate.name} failed on node {evidence.node}, and passed for this arm on "
            f"{evidence.gate_passed_on}: the node, not the campaign"
        )
    if signal in _SIGNALS:
        return f"killed by {_SIGNALS[signal]}"
    if status is not None and status - 128 in _SIGNALS:
        return f"exit {status}: its pytest was killed by {_SIGNALS[status - 128]}"
    return None


def _cancelled(evidence: Evidence, rules: Rules) -> Decision:
    dependency = evidence.dependency
    if dependency is not None and not dependency.done:
        return Decision(
            Action.WAIT,
            "Slurm cancelled it before it started, as a job it waited for failed; it runs "
            f"again once {dependency.detail} done",
        )
    if dependency is not None:
        why = (
            "Slurm cancelled it before it started, as a job it waited for failed "
            f"({dependency.detail} done now)"
        )
        return _rerun(why, evidence, rules)
    if rules.include_cancelled:
        return _rerun("cancelled, and --include-cancelled reruns it", evidence, rules)
    return Decision(
        Action.HOLD,
        f"cancelled (scancel), not rerun: --include-cancelled reruns its {evidence.owed} "
        "owed items",
    )


def _rerun(why: str, evidence: Evidence, rules: Rules) -> Decision:
    if evidence.stalled >= rules.max_rounds:
        return Decision(
            Action.STOP,
            f"{why}, but its last {evidence.stalled} attempts in a row that had their chance "
            "(their walltime, or their stack up) recorded no item "
            f"(--max-rounds {rules.max_rounds}): read its log {evidence.log}; a larger "
            "--max-rounds reruns it",
        )
    return Decision(Action.RERUN, why)


def _status(end: TaskState) -> int | None:
    """The exit status of ``75:0``; None when Slurm did not say."""
    status = end.exit_code.partition(":")[0]
    return int(status) if status.isdigit() else None


def _signal(end: TaskState) -> int | None:
    """The signal of ``0:9``; None when there was none."""
    signal = end.exit_code.partition(":")[2]
    return int(signal) if signal.isdigit() and int(signal) else None
