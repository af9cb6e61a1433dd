"""The results API on hand-written campaigns: scopes, newest records as resume picks them,
orphans, schemas 1 and 2, flattened frames, and one-line errors for bad input."""

from __future__ import annotations

import builtins
import json
from pathlib import Path
from typing import Any

import pytest

from pytest_haico.ledger.format import iter_ledger_dir
from pytest_haico.ledger.resume import ResumeIndex
from pytest_haico.results import (
    RECORD_FIELDS,
    MissingExtraError,
    NoRecordsError,
    NotResultsError,
    ResultsReadError,
    TranscriptMissingError,
    load_results,
    parse_identity,
)
from tests.results.ledgers import item_id, record, write_ledger


@pytest.fixture
def campaign_dir(tmp_path: Path) -> Path:
    """Two arms; arm demo has two runs, a retried item, a torn line, an unknown schema,
    and an orphan transcript of a killed attempt."""
    campaign = tmp_path / "results" / "c"
    demo = campaign / "demo"
    write_ledger(
        demo,
        "local-1.1",
        [
            record("a", schema=1),
            record("b", verdict="infra_error", finished_at="2026-11-01T10:00:05+00:00"),
            json.dumps({"schema": 99, "item_id": "x"}) + "\n",
            record("c", verdict="expectation_failed"),
        ],
    )
    write_ledger(
        demo,
        "local-2.1",
        [
            record("b", run_id="local-2.1", attempt=2, finished_at="2026-11-01T11:00:00+00:00"),
            '{"schema":2,"run_id":"local-2.1","item_',  # killed mid-write
        ],
    )
    (demo / "transcripts" / f"{item_id('d')}.local-2.1.1.jsonl").write_text("")
    write_ledger(campaign / "other", "local-1.1", [record("a", arm="other", turns=3)])
    return campaign


def test_a_campaign_loads_every_attempt_of_every_arm_and_warns_about_skipped_lines(
    campaign_dir: Path,
) -> None:
    warned: list[str] = []
    results = load_results(campaign_dir, warn=warned.append)
    assert [(r.arm, r.script, r.attempt) for r in results.records] == [
        ("demo", "a", 1),
        ("demo", "b", 1),
        ("demo", "c", 1),
        ("demo", "b", 2),
        ("other", "a", 1),
    ]
    assert warned == results.warnings
    ledger = campaign_dir / "demo" / "ledger"
    assert warned == [
        f"{ledger}/local-1.1.jsonl:3: skipped a record of schema 99, newer than this "
        "pytest-haico reads (2); upgrade pytest-haico",
        f"{ledger}/local-2.1.jsonl:2: skipped a torn last line (a kill mid-write?)",
    ]


def test_newest_keeps_the_record_resume_decides_on(campaign_dir: Path) -> None:
    results = load_results(campaign_dir / "demo")
    index = ResumeIndex()
    index.add_all(
        iter_ledger_dir(campaign_dir / "demo" / "ledger", warn=lambda _: None), warn=lambda _: None
    )
    newest = results.newest()
    assert [(r.script, r.attempt, r.verdict) for r in newest] == [
        ("a", 1, "completed"),
        ("c", 1, "expectation_failed"),
        ("b", 2, "completed"),
    ]
    for r in newest:
        prior = index.get(r.item_id)
        assert prior is not None and (prior.attempt, prior.verdict) == (r.attempt, r.verdict)


def test_newest_only_streams_each_items_newest_and_counts_every_attempt(
    campaign_dir: Path,
) -> None:
    every = load_results(campaign_dir)
    streamed = load_results(campaign_dir, newest_only=True, fields=("turns.tokens_in",))
    assert [(r.arm, r.script, r.attempt) for r in streamed.records] == [
        (r.arm, r.script, r.attempt) for r in every.newest()
    ]
    assert streamed.newest() == streamed.records
    assert streamed.attempts == every.attempts and len(every.attempts) == len(every.records)
    assert streamed.attempt_kinds() == every.attempt_kinds() == ["first"] * 3 + ["retry", "first"]
    assert (streamed.orphans, streamed.warnings) == (every.orphans, every.warnings)
    # Of a kept record: what Record reads and the fields asked for, nothing else.
    kept = streamed.records[0].data
    assert set(kept) == set(RECORD_FIELDS) | {"turns"}
    assert kept["turns"] == [{"tokens_in": t["tokens_in"]} for t in every.records[0].turns]
    with pytest.raises(ResultsReadError, match=r"frame\(\) needs every record"):
        streamed.frame()


def test_a_transcript_without_its_attempts_record_is_an_orphan(campaign_dir: Path) -> None:
    results = load_results(campaign_dir)
    [orphan] = results.orphans
    assert (orphan.arm, orphan.item_id, orphan.run_id, orphan.attempt) == (
        "demo",
        item_id("d"),
        "local-2.1",
        1,
    )
    assert load_results(campaign_dir, run="local-1.1").orphans == []


@pytest.mark.parametrize(
    "where",
    ["demo/ledger/local-2.1.jsonl", "demo/runs/local-2.1", "@local-2.1"],
)
def test_one_run_is_named_by_its_ledger_its_directory_or_its_id(
    campaign_dir: Path, where: str
) -> None:
    (campaign_dir / "demo" / "runs" / "local-2.1").mkdir(parents=True)
    if where.startswith("@"):
        results = load_results(campaign_dir, run=where[1:])
    else:
        results = load_results(campaign_dir / where)
    assert [(r.script, r.attempt) for r in results.records] == [("b", 2)]
    assert len(results.orphans) == 1


def test_the_frame_flattens_settings_and_identities_and_sums_the_turns(
    campaign_dir: Path,
) -> None:
    pytest.importorskip("pandas")
    results = load_results(campaign_dir)
    frame = results.frame()
    assert len(frame) == 5
    row = frame[(frame["arm"] == "demo") & (frame["script"] == "c")].iloc[0]
    assert row["settings.generation.temperature"] == 0.7
    assert row["settings.agent.recursion_limit"] == 12
    assert row["model_identity.config_sha256"] == "cd" * 32
    assert tuple(row["tags"]) == ("smoke",)
    assert (row["n_turns"], row["turns.tokens_out"], row["turns.tool_calls"]) == (2, 30, 1)
    assert row["turns.latency_s"] == 1.0
    assert row["turns.expectations_failed"] == 1
    assert row["error.kind"] == "expectation_failed"
    # Schema 1's identity, a string holding JSON, lands in the same columns.
    old = frame[(frame["arm"] == "demo") & (frame["script"] == "a")].iloc[0]
    assert (old["model_identity.kind"], old["model_identity.path"]) == ("standin", "/models/m")
    assert list(frame["retry"]) == [False, False, False, True, False]
    assert not frame["rerun"].any()
    assert list(frame["newest"]) == [True, False, True, True, True]
    newest = results.frame(newest=True)
    assert list(newest["script"]) == ["a", "c", "b", "a"]
    assert str(newest["finished_at"].dtype).startswith("datetime64")


def test_the_turns_frame_has_a_row_per_turn(campaign_dir: Path) -> None:
    pytest.importorskip("pandas")
    turns = load_results(campaign_dir).turns_frame()
    assert len(turns) == 2 + 2 + 2 + 2 + 3
    assert {"arm", "script", "attempt", "index", "tokens_out", "expectations_failed"} <= set(
        turns.columns
    )


def test_without_pandas_the_frame_names_the_extra_to_install(
    campaign_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_import = builtins.__import__

    def no_pandas(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "pandas":
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_pandas)
    with pytest.raises(MissingExtraError) as raised:
        load_results(campaign_dir).frame()
    assert str(raised.value) == (
        "Results.frame() needs pandas, which is not installed: pip install 'pytest-haico[analysis]'"
    )


def test_the_transcript_skips_its_header_and_a_missing_one_is_one_line(
    campaign_dir: Path,
) -> None:
    results = load_results(campaign_dir)
    first = results.records[0]
    assert results.transcript(first) == [{"turn": 0, "kind": "request", "body": {"query": "hi"}}]
    first.transcript_path.unlink()
    with pytest.raises(TranscriptMissingError, match=r"^the transcript .* is missing: it was"):
        results.transcript(first)


def test_a_path_that_is_no_campaign_names_what_to_give(tmp_path: Path) -> None:
    with pytest.raises(NotResultsError) as raised:
        load_results(tmp_path)
    assert str(raised.value) == (
        f"{tmp_path} holds no <arm>/ledger/ directory: give <results>/<campaign> (it holds "
        "<arm>/ledger/), <campaign>/<arm>, <arm>/runs/<run_id> or <arm>/ledger/<run_id>.jsonl"
    )
    with pytest.raises(NotResultsError, match="does not exist: give"):
        load_results(tmp_path / "missing")


def test_an_empty_campaign_says_to_run_it_first(tmp_path: Path) -> None:
    (tmp_path / "c" / "demo" / "ledger").mkdir(parents=True)
    (tmp_path / "c" / "demo" / "ledger" / "r.1.jsonl").write_text('{"schema": 7}\n')
    with pytest.raises(NoRecordsError) as raised:
        load_results(tmp_path / "c")
    message = str(raised.value)
    assert message.startswith(
        f"no ledger record in {tmp_path / 'c'} (<arm>/ledger/*.jsonl): run the campaign first"
    )
    assert "1 line(s) skipped, first: " in message and "\n" not in message


def test_an_identity_string_holding_json_is_parsed() -> None:
    assert parse_identity('standin:{"persona": "blank"}') == {"kind": "standin", "persona": "blank"}
    assert parse_identity('{"a": 1}') == {"a": 1}
    assert parse_identity("sha256:abc") is None
    assert parse_identity({"image": "x"}) == {"image": "x"}
