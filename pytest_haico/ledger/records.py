"""The ledger record (schema 1): one JSON line per item attempt."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from pytest_haico.ledger.verdicts import Outcome, Verdict

SCHEMA_VERSION = 1


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


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
    """One item attempt, as appended to ``<arm>/ledger/<run_id>.jsonl``."""

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
    model_identity: str
    backend_identity: str
    turns: tuple[TurnRecord, ...] = ()
    error: ErrorInfo | None = None
    slurm: SlurmInfo | None = None
    harness_version: str

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    def to_line(self) -> bytes:
        """The record as one newline-terminated JSON line."""
        return self.model_dump_json(by_alias=True).encode() + b"\n"
