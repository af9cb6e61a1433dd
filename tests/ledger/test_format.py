"""The ledger's line format: the leading fields as written, the fast paths reading what the
JSON parse reads, and every reader (resume, the results API, `haico cost`) skipping the
same lines with the same warnings."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_haico.ledger import damage
from pytest_haico.ledger.format import (
    LEADING_FIELDS,
    iter_ledger,
    iter_ledger_dir,
    leading_fields_pattern,
)
from pytest_haico.ledger.records import LedgerRecord, TurnRecord, record_line
from pytest_haico.ledger.resume import ResumeIndex
from pytest_haico.ledger.verdicts import Outcome, Verdict
from pytest_haico.report.item_costs import load_costs
from pytest_haico.results import load_results
from tests.campaign.test_ledger import make_record
from tests.ledger.schema_lines import SCHEMA_1_LINE

# A record whose `nodeid` (a lone surrogate) orjson refuses and json reads: a record.
SURROGATE_LINE = record_line(make_record("b" * 64)).replace(b'"t::x"', b'"t::\\ud800"')


def _damaged(item: str, written: bytes, damaged: bytes) -> bytes:
    line = record_line(make_record(item * 64))
    assert written in line
    return line.replace(written, damaged)


# Records every reader skips as damaged (`damaged_field`), by the parse and the fast paths,
# with the warning each is worth.
DAMAGED_LINES = [
    (_damaged("d", b'"duration_s":1.0', b'"duration_s":NaN'), "duration_s (nan)"),
    (_damaged("e", b'"duration_s":1.0', b'"duration_s":-1e308'), "duration_s (-1e+308)"),
    (_damaged("f", b'"duration_s":1.0', b'"duration_s":1e999'), "duration_s (inf)"),
    (_damaged("1", b'"repeat":0', b'"repeat":"r0"'), "repeat ('r0')"),
    (_damaged("2", b'"repeat":0', b'"repeat":-1'), "repeat (-1)"),
    (_damaged("3", b'"stratum":"default"', b'"stratum":5'), "stratum (5)"),
]
_WHY = {
    "duration_s": "not a finite number >= 0",
    "repeat ('r0')": "not an integer",
    "repeat (-1)": "negative",
    "stratum": "not a string",
}
FUTURE_LINE = SCHEMA_1_LINE.replace(b'{"schema":1,', b'{"schema":3,')


def write_damaged_ledger(ledger_dir: Path) -> tuple[Path, list[str]]:
    """A ledger with every kind of line a reader skips, and the warnings they are worth."""
    ledger_dir.mkdir(parents=True)
    path = ledger_dir / "local-1.1.jsonl"
    lines = [
        SCHEMA_1_LINE,
        b"not json\n",
        record_line(make_record("a" * 64)),
        b"\n",
        FUTURE_LINE,
        b"[1]\n",
        b'{"schema": true, "item_id": "x"}\n',
        SURROGATE_LINE,
        *(line for line, _ in DAMAGED_LINES),
        record_line(make_record("c" * 64))[:90],  # killed mid-write
    ]
    path.write_bytes(b"".join(lines))
    warnings = [
        f"{path}:2: skipped not valid JSON",
        f"{path}:5: skipped a record of schema 3, newer than this pytest-haico reads (2); "
        "upgrade pytest-haico",
        f"{path}:6: skipped, not a JSON object",
        f"{path}:7: skipped a record without a known schema (True)",
    ]
    for number, (_, field) in enumerate(DAMAGED_LINES, 9):
        why = next(why for name, why in _WHY.items() if field.startswith(name))
        warnings.append(f"{path}:{number}: skipped a damaged record: {field}: {why}")
    warnings.append(f"{path}:{len(lines)}: skipped a torn last line (a kill mid-write?)")
    return path, warnings


READ_ITEMS = ["9f" * 32, "a" * 64, "b" * 64]


def test_a_written_line_starts_with_the_leading_fields_in_their_order() -> None:
    names = [name for name, _ in LEADING_FIELDS]
    assert list(json.loads(record_line(make_record())))[: len(names)] == names
    aliases = [field.alias or name for name, field in LedgerRecord.model_fields.items()]
    assert aliases[: len(names)] == names


def test_the_leading_fields_pattern_captures_values_as_written_in_line_order() -> None:
    pattern = leading_fields_pattern("verdict", "schema", "duration_s", "attempt")
    match = pattern.match(record_line(make_record()))
    assert match is not None
    assert match.groups() == (b"2", b"1", b"completed", b"1.0")
    assert pattern.match(FUTURE_LINE) is None


def test_a_string_with_an_escape_is_left_to_the_json_parse(tmp_path: Path) -> None:
    line = record_line(make_record()).replace(b'"finished_at":"', b'"finished_at":"\\u0032')
    assert leading_fields_pattern("finished_at").match(line) is None
    path = tmp_path / "run.jsonl"
    path.write_bytes(line)
    (fast,) = iter_ledger(path, warn=pytest.fail, resume_fields=True)
    assert fast.data["finished_at"] == json.loads(line)["finished_at"]


def test_resume_reads_the_same_records_and_warnings_by_both_paths(tmp_path: Path) -> None:
    path, expected = write_damaged_ledger(tmp_path / "ledger")
    read: dict[bool, tuple[list[tuple[object, ...]], list[str]]] = {}
    for fast in (False, True):
        warnings: list[str] = []
        records = iter_ledger(path, warn=warnings.append, resume_fields=fast)
        read[fast] = [(r.line, r.data["item_id"], r.data["verdict"]) for r in records], warnings
    assert read[True] == read[False]
    assert [item for _, item, _ in read[True][0]] == READ_ITEMS
    assert read[True][1] == expected
    assert path.read_bytes().endswith(record_line(make_record("c" * 64))[:90])  # never rewritten


def test_every_reader_skips_the_same_lines_with_the_same_warnings(tmp_path: Path) -> None:
    campaign = tmp_path / "results" / "default"
    _, expected = write_damaged_ledger(campaign / "demo" / "ledger")

    resumed: list[str] = []
    index = ResumeIndex()
    index.add_all(
        iter_ledger_dir(campaign / "demo" / "ledger", warn=resumed.append, resume_fields=True),
        warn=resumed.append,
    )
    results = load_results(campaign)
    costed: list[str] = []
    costs = load_costs(campaign, warn=costed.append)

    assert resumed == results.warnings == costed == expected
    assert sorted(r.item_id for r in results.records) == READ_ITEMS
    assert all(index.get(item) is not None for item in READ_ITEMS) and len(index) == 3
    assert costs[("demo", "default")].done == 3


def test_the_results_api_skips_a_ledger_that_is_no_regular_file(tmp_path: Path) -> None:
    campaign = tmp_path / "c"
    ledger = campaign / "demo" / "ledger"
    ledger.mkdir(parents=True)
    (ledger / "a.jsonl").write_bytes(SCHEMA_1_LINE)
    os.mkfifo(ledger / "b.jsonl")
    results = load_results(campaign)
    assert [r.item_id for r in results.records] == ["9f" * 32]
    assert results.warnings == [f"{ledger / 'b.jsonl'}: skipped, not a regular file"]


@pytest.mark.subprocess
@pytest.mark.parametrize(
    "module", ["pytest_haico.results", "pytest_haico.report.data", "pytest_haico.report.item_costs"]
)
def test_the_readers_of_the_results_import_no_pydantic(module: str) -> None:
    probe = f"import sys, {module}; print(sorted(m for m in sys.modules if 'pydantic' in m))"
    shown = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout
    assert shown == "[]\n"


_KINDS = {int: "int", str: "str", float: "number", Outcome: "str", Verdict: "str"}


def test_the_leading_fields_kinds_are_the_record_models_types() -> None:
    """The readers' model of a line's leading fields (`LEADING_FIELDS`) and the writer's
    (`LedgerRecord`) name the same fields, in the same order, of the same kinds."""
    model = [
        (field.alias or name, _KINDS[field.annotation])  # type: ignore[index]
        for name, field in list(LedgerRecord.model_fields.items())[: len(LEADING_FIELDS)]
    ]
    assert model == list(LEADING_FIELDS)


def test_the_turn_fields_the_readers_check_are_the_turn_models_counts_and_seconds() -> None:
    """What `damaged_field` checks of a turn is what `TurnRecord` declares: counts are
    integers, seconds floats (optional where a turn may lack them)."""
    fields = TurnRecord.model_fields
    assert all(fields[name].annotation in (int, int | None) for name in damage._TURN_COUNTS)
    assert all(fields[name].annotation == float | None for name in damage._TURN_SECONDS)
