"""The results API: a campaign's, an arm's or a run's ledger records, for analysis.

    from pytest_haico.results import load_results

    results = load_results("results/default")                  # a campaign: every arm
    results = load_results("results/default/demo")             # one arm
    results = load_results("results/default", run="4711_0.1")  # one run (of any arm)
    results = load_results("results/default/demo/ledger/4711_0.1.jsonl")  # the same run

    results.records        # every attempt, in ledger order (runs by name, lines as written)
    results.newest()       # each item's newest record: the one resume decides on
    results.attempts       # per record: what counting needs (arm, item_id, run_id, verdict...)
    results.attempt_kinds()  # per record: "first", "retry" (after an owed attempt), "rerun"
    load_results("results/default", newest_only=True)  # streams: records = newest() only,
                           # attempts still of every record: memory grows with the items
    results.orphans        # transcripts of attempts with no record (killed mid-item)
    results.warnings       # every line skipped, with file and line
    results.transcript(r)  # a record's transcript events, turn by turn
    results.frame()        # a pandas DataFrame, one row per attempt (newest=True: per item)
    results.turns_frame()  # one row per turn
    results.compare(other)  # paired by item with `other`: per stratum and overall, the
                           # pass rates, the difference B − A, McNemar's p (as haico compare)

A path is a campaign (`<results>/<campaign>`, holding `<arm>/ledger/`), an arm
(`<campaign>/<arm>`), a run directory (`<arm>/runs/<run_id>`) or a run's ledger file
(`<arm>/ledger/<run_id>.jsonl`). The ledger reader (`pytest_haico.ledger.format`) reads
them, as resume does: records of schema 1 and 2 alike; a line of another schema, a torn
last line (a kill mid-write) or garbage is skipped with a warning naming the file and line.

The frame flattens nested objects into dotted columns (`settings.generation.temperature`,
`slurm.node`, `error.kind`); an identity written as a string that holds JSON
(`standin:{...}` in schema 1) is parsed like the object schema 2 writes
(`model_identity.persona`, with `model_identity.kind` for the prefix); `tags` stays a
list. Turns are summarised per record: `n_turns` and the sums `turns.latency_s`,
`turns.first_event_s`, `turns.steps`, `turns.tool_calls`, `turns.tool_errors`,
`turns.tokens_in`, `turns.tokens_out`, `turns.expectations_failed`. Added columns:
`newest` (the item's newest record), `retry` (an infrastructure retry: an attempt after
one the ledger left owed, infra_error, rate_limited or interrupted), `rerun` (a deliberate
rerun: a record after the item was done, --haico-no-resume), `ledger`, `line`,
`transcript` (its path).

pandas and scipy are an optional extra: ``pip install 'pytest-haico[analysis]'``;
without them `frame` and `compare` raise `MissingExtraError` saying so. Every error here is
a `ResultsReadError` whose message is one line naming the path and what to do:

    HaicoError
    └── ResultsReadError       the results cannot be read as asked
        ├── NotResultsError    the path is no campaign, arm or run
        ├── NoRecordsError     nothing recorded there (yet)
        ├── TranscriptMissingError  a record's transcript file is missing
        └── MissingExtraError  an optional extra (pandas, scipy, matplotlib) is not installed
"""

from __future__ import annotations

from pytest_haico.results.frame import expectation_failed, parse_identity, summarize_turns
from pytest_haico.results.reader import SCHEMAS, load_results
from pytest_haico.results.records import (
    FIRST,
    RECORD_FIELDS,
    RERUN,
    RETRY,
    Attempt,
    MissingExtraError,
    NoRecordsError,
    NotResultsError,
    Orphan,
    Record,
    Results,
    ResultsReadError,
    TranscriptMissingError,
    paused_gc,
    require,
)

__all__ = [
    "FIRST",
    "RECORD_FIELDS",
    "RERUN",
    "RETRY",
    "SCHEMAS",
    "Attempt",
    "MissingExtraError",
    "NoRecordsError",
    "NotResultsError",
    "Orphan",
    "Record",
    "Results",
    "ResultsReadError",
    "TranscriptMissingError",
    "expectation_failed",
    "load_results",
    "parse_identity",
    "paused_gc",
    "require",
    "summarize_turns",
]
