"""The ledger record model: one item attempt, its turns, error and Slurm placement, as
validated before it is written, and its one line (the line's format and schema versions:
`ledger.format`)."""

from __future__ import annotations

from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    SerializerFunctionWrapHandler,
    model_serializer,
)

from pytest_haico.ledger.format import SCHEMA_VERSION
from pytest_haico.ledger.verdicts import Outcome, Verdict


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class JudgeRecord(_Record):
    """Who scored a `judge` expectation and what it said: the judge's catalogue `name`, the
    model it serves (`served_name`; `model`: its identity, as `model_identity`'s object),
    the vLLM version and Slurm job serving it, and its `answer` as received (redacted)."""

    name: str
    served_name: str
    model: dict[str, JsonValue]
    vllm_version: str | None = None
    job_id: str
    answer: str


class ExpectationResult(_Record):
    """One expectation of a turn's script, checked: `expectation` is its key in the
    script (`contains`, `matches`, `tool_called`...), `expected` its value there, and
    `seen` what the turn produced instead, in a few words. A `judge` expectation also
    has `judge` (a key written only when set: older records and other keys lack it)."""

    expectation: str
    expected: JsonValue
    passed: bool
    seen: str
    judge: JudgeRecord | None = None

    @model_serializer(mode="wrap")
    def _without_unset_judge(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        fields: dict[str, Any] = handler(self)
        if fields.get("judge") is None:
            fields.pop("judge", None)
        return fields


class TurnRecord(_Record):
    """Per-turn metrics of one conversation."""

    index: int
    thread_id: str | None = None
    branch_from: int | None = None
    latency_s: float | None = None
    first_event_s: float | None = None
    steps: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    tokens_in: int | None = None
    tokens_out: int | None = None
    provider: str | None = None
    model_id: str | None = None
    snapshot_id: str | None = None
    expectations: tuple[ExpectationResult, ...] = ()


class ErrorInfo(_Record):
    """Why an attempt did not complete: a kind and a (redacted) message."""

    kind: str
    message: str


class SlurmInfo(_Record):
    """Where the attempt ran, when it ran inside a Slurm job."""

    job_id: str | None
    array_job_id: str | None
    array_task_id: str | None
    node: str | None
    restart_count: int


class LedgerRecord(_Record):
    """One item attempt, as appended to ``<arm>/ledger/<run_id>.jsonl`` (`record_line`).

    The fields through `duration_s` are `LEADING_FIELDS`, in that order: the resume and
    cost readers match them without a JSON parse. New fields go after them.
    """

    schema_: int = Field(default=SCHEMA_VERSION, alias="schema")
    run_id: str
    campaign: str
    arm: str
    stratum: str
    item_id: str
    nodeid: str
    script: str
    script_sha256: str
    repeat: int
    attempt: int
    outcome: Outcome
    verdict: Verdict
    started_at: str
    finished_at: str
    duration_s: float
    in_flight_at_start: int = 0
    model_identity: dict[str, JsonValue]
    backend_identity: dict[str, JsonValue]
    tags: tuple[str, ...] = ()
    settings: dict[str, dict[str, JsonValue]] = Field(default_factory=dict)
    turns: tuple[TurnRecord, ...] = ()
    error: ErrorInfo | None = None
    slurm: SlurmInfo | None = None
    harness_version: str

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


def record_line(record: LedgerRecord) -> bytes:
    """A record as its one line: compact JSON in the model's field order, then a newline."""
    return record.model_dump_json(by_alias=True).encode() + b"\n"
