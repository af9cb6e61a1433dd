"""Judging one turn: what its events and its snapshot say, as findings (a verdict and a reason)."""

from __future__ import annotations

from dataclasses import dataclass, field

from pytest_haico.config.experiment import Arm, Turn
from pytest_haico.driver import wire
from pytest_haico.driver.expectations import check_expectations, describe_failure
from pytest_haico.driver.snapshots import VLLM_PROVIDER, Snapshot
from pytest_haico.ledger.records import ErrorInfo, ExpectationResult, TurnRecord
from pytest_haico.ledger.verdicts import Verdict


@dataclass(frozen=True, slots=True)
class Finding:
    """One reason for a verdict, found in one turn."""

    verdict: Verdict
    error: ErrorInfo


def make_finding(verdict: Verdict, message: str, *, kind: str | None = None) -> Finding:
    """A finding whose error kind is ``kind``, or the verdict's name."""
    return Finding(verdict, ErrorInfo(kind=kind or verdict.value, message=message))


@dataclass(slots=True)
class TurnState:
    """What one turn has produced so far: the backend's events, timings and its snapshot."""

    index: int
    thread_id: str
    branch_from: int | None
    started: float
    backend_index: int | None = None
    first_event_s: float | None = None
    latency_s: float | None = None
    steps: list[wire.Step] = field(default_factory=list)
    terminal: wire.TerminalEvent | None = None
    snapshot: Snapshot | None = None
    expectations: list[ExpectationResult] = field(default_factory=list)

    @property
    def snapshot_index(self) -> int:
        """The turn's index as the backend counts it (its snapshot row's ``turn_index``)."""
        return self.index if self.backend_index is None else self.backend_index

    def observe(self, event: wire.BackendEvent) -> None:
        """Take one event of the turn's stream into account."""
        if isinstance(event, wire.OtherEvent):
            return
        # A branch may be answered on a new thread: follow what the backend reports.
        if event.thread_id:
            self.thread_id = event.thread_id
        if event.turn_index is not None:
            self.backend_index = event.turn_index
        if isinstance(event, wire.StepEvent):
            self.steps.append(event.step)
        else:
            self.terminal = event

    def record(self) -> TurnRecord:
        """The turn's ledger metrics."""
        usage = self.terminal.usage if isinstance(self.terminal, wire.CompleteEvent) else None
        return TurnRecord(
            index=self.index,
            thread_id=self.thread_id,
            branch_from=self.branch_from,
            latency_s=self.latency_s,
            first_event_s=self.first_event_s,
            steps=len(self.steps),
            tool_calls=sum(len(step.tool_calls) for step in self.steps),
            tool_errors=sum(step.has_tool_error for step in self.steps),
            tokens_in=usage.tokens_in if usage else None,
            tokens_out=usage.tokens_out if usage else None,
            provider=self.snapshot.provider if self.snapshot else None,
            model_id=self.snapshot.model_id if self.snapshot else None,
            snapshot_id=self.snapshot.snapshot_id if self.snapshot else None,
            expectations=tuple(self.expectations),
        )

    @property
    def answer(self) -> str:
        """The turn's answer: the text of its final step ("" without a step)."""
        return self.steps[-1].text if self.steps else ""


def judge_stream_end(state: TurnState) -> Finding | None:
    """An infra finding when the stream ended without a terminal event or with a backend error."""
    terminal = state.terminal
    if terminal is None:
        message = (
            f"the stream ended after {len(state.steps)} steps without a complete or "
            "error event (cut, or the backend died mid-turn)"
        )
        return make_finding(Verdict.INFRA_ERROR, message, kind="broken_stream")
    if isinstance(terminal, wire.ErrorEvent) and not terminal.is_recursion_limit:
        message = f"the backend reported an error of kind {terminal.kind!r}: {terminal.error}"
        return make_finding(Verdict.INFRA_ERROR, message, kind=f"backend_{terminal.kind}")
    return None


def judge_turn(turn: Turn, state: TurnState, *, recursion_limit: int) -> list[Finding]:
    """The model-behaviour verdicts of a turn that ended with a complete or error event.

    The turn's expectations are checked whatever else went wrong, and kept in ``state``
    (its record carries them); each failed one is a finding of its own.
    """
    findings: list[Finding] = []
    terminal, steps = state.terminal, state.steps
    final = steps[-1] if steps else None
    reasons = []
    if isinstance(terminal, wire.ErrorEvent) and terminal.is_recursion_limit:
        reasons.append(f"the backend reported an error of kind 'recursion_limit': {terminal.error}")
    if isinstance(terminal, wire.CompleteEvent) and terminal.recursion_limit_reached:
        reasons.append("the backend flagged recursion_limit_reached")
    if final is not None and final.is_canned_recursion_reply:
        reasons.append(f"the final step is the framework's canned reply {final.text.strip()!r}")
    if len(steps) >= recursion_limit:
        reasons.append(f"it took {len(steps)} steps, the limit is {recursion_limit}")
    if reasons:
        message = f"turn {state.index + 1} hit the recursion limit ({recursion_limit}): "
        findings.append(make_finding(Verdict.RECURSION_LIMIT, message + "; ".join(reasons)))
    elif final is None:
        message = f"turn {state.index + 1} ended without any step"
        findings.append(make_finding(Verdict.BLANK_TURN, message))
    elif not final.text.strip() and not final.tool_calls:
        message = (
            f"turn {state.index + 1} ended without an answer: the final step is empty, no tool call"
        )
        findings.append(make_finding(Verdict.BLANK_TURN, message))
    state.expectations = check_expectations(turn.expect, steps)
    for result in state.expectations:
        if not result.passed:
            message = describe_failure(state.index, result)
            findings.append(make_finding(Verdict.EXPECTATION_FAILED, message))
    return findings


def judge_snapshot(state: TurnState, arm: Arm, *, wait_s: float) -> Finding | None:
    """Whether the arm's model served the turn, by the snapshot row read after it (if any)."""
    snapshot, index = state.snapshot, state.snapshot_index
    if snapshot is None:
        # After a recursion-limit error the backend may have persisted nothing.
        if isinstance(state.terminal, wire.ErrorEvent):
            return None
        message = (
            f"no workspace_snapshots row for thread {state.thread_id} turn_index {index} "
            f"(turn {state.index + 1}) after {wait_s:g} s: which model served the turn cannot be "
            "checked"
        )
        return make_finding(Verdict.INFRA_ERROR, message, kind="snapshot")
    if snapshot.is_served_by(provider=VLLM_PROVIDER, model_id=arm.served_name):
        return None
    message = (
        f"turn {state.index + 1} was served by provider {snapshot.provider!r}, model "
        f"{snapshot.model_id!r} (snapshot {snapshot.snapshot_id}); the arm expects "
        f"{VLLM_PROVIDER!r}, {arm.served_name!r}"
    )
    return make_finding(Verdict.SUBSTITUTED, message)
