"""The ledger record: one JSON line per item attempt, and how its schema version moves.

Schema 2 (written now) adds to schema 1, after the fields the fast readers match
(`schema` … `duration_s`, whose order and compact form never change):

* `model_identity` and `backend_identity` are JSON objects with a `kind` (`standin`,
  `path`, `hf`, `endpoint`; `standin`, `image`, `cmd`; or `unspecified`) and that
  kind's fields; schema 1 wrote them as strings (`config.identity.parse_*_identity`
  turns such a string into the same object);
* `tags`: the script's tags; `settings`: the arm's resolved `model`, `vllm`,
  `generation` and `agent` sections, as the item's identity hashes them;
* each turn's `expectations`: every expectation checked on the turn, passed or not,
  with what was seen.

How the version moves: every change to the set, the types or the meaning of the
fields gets the next version, and readers are changed in the same release to read it.
A reader reads every version up to its own (`READABLE_SCHEMAS`): a field that an older
record lacks reads as missing, schema 1's identities as strings. A record of a higher
version is skipped with a warning naming the file and line (upgrade pytest-haico),
never guessed at: its fields may mean something else. Nothing ever rewrites a ledger.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, JsonValue

from pytest_haico.ledger.verdicts import Outcome, Verdict

SCHEMA_VERSION = 2
# The versions readers of this package read (every one up to SCHEMA_VERSION).
READABLE_SCHEMAS = frozenset(range(1, SCHEMA_VERSION + 1))
# The same, as a regular expression's alternatives, for the readers that match a line's
# leading fields without a JSON parse.
READABLE_SCHEMAS_PATTERN = "|".join(map(str, sorted(READABLE_SCHEMAS))).encode()


def is_readable_schema(value: object) -> bool:
    """Whether a record's `schema` value is one this package reads (`true` is no 1)."""
    return type(value) is int and value in READABLE_SCHEMAS


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ExpectationResult(_Record):
    """One expectation of a turn's script, checked: `expectation` is its key in the
    script (`contains`, `matches`, `tool_called`...), `expected` its value there, and
    `seen` what the turn produced instead, in a few words."""

    expectation: str
    expected: JsonValue
    passed: bool
    seen: str


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
    """One item attempt, as appended to ``<arm>/ledger/<run_id>.jsonl``.

    The fields through `duration_s` keep their order and compact form: the resume and
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

    def to_line(self) -> bytes:
        """The record as one newline-terminated JSON line."""
        return self.model_dump_json(by_alias=True).encode() + b"\n"
