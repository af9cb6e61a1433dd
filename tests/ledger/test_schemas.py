"""Ledger schema 2 as written, and every reader reading schemas 1 and 2 alike (3+ skipped)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pytest_haico.config.experiment import load_experiments
from pytest_haico.config.identity import parse_backend_identity, parse_model_identity
from pytest_haico.config.items import ItemSpec, build_item_specs
from pytest_haico.config.settings import Profile
from pytest_haico.config.slurm import SlurmJob
from pytest_haico.ledger.format import SCHEMA_VERSION, iter_ledger, iter_ledger_dir
from pytest_haico.ledger.item_times import ItemTimes
from pytest_haico.ledger.recorder import ItemAttempt, Recorder
from pytest_haico.ledger.records import ExpectationResult, TurnRecord
from pytest_haico.ledger.resume import ResumeIndex
from pytest_haico.ledger.verdicts import Verdict
from tests.ledger.schema_lines import SCHEMA_1_LINE

ARM = """
[model]
served_name = "demo"
[generation]
max_tokens = 512
temperature = 0.7
[agent]
recursion_limit = 12
[standin]
latency_ms = 20
"""
SCRIPT = """
id: greet
tags: [smoke, short]
turns:
  - user: "Hello! Who are you?"
    expect: {contains: "Hello"}
"""


def demo_spec(tmp_path: Path) -> ItemSpec:
    (tmp_path / "experiments" / "arms").mkdir(parents=True)
    (tmp_path / "experiments" / "scripts").mkdir()
    (tmp_path / "experiments" / "arms" / "demo.toml").write_text(ARM)
    (tmp_path / "experiments" / "scripts" / "greet.yaml").write_text(SCRIPT)
    settings = SimpleNamespace(
        profile=Profile.LOCAL, model_endpoint=None, backend_image=None, backend_cmd=None
    )
    (spec,) = build_item_specs(load_experiments(tmp_path / "experiments"), settings)
    return spec


def record_one(tmp_path: Path, **turn: Any) -> tuple[ItemSpec, bytes]:
    """One attempt of the demo item recorded as the runner records it; its ledger line."""
    spec = demo_spec(tmp_path)
    recorder = Recorder(
        campaign_dir=tmp_path / "results" / "default",
        campaign="default",
        job=SlurmJob.from_environ({}),
        max_attempts=3,
    )
    try:
        state = ItemAttempt(spec, "experiments/test_conversations.py::test[x]", attempt=1)
        recorder.record(state, Verdict.COMPLETED, turns=[TurnRecord(index=0, **turn)])
        (path,) = recorder.ledger_paths().values()
    finally:
        recorder.close()
    return spec, path.read_bytes()


def read_all(path: Path, *, fast: bool = False) -> tuple[list[dict[str, Any]], list[str]]:
    warnings: list[str] = []
    records = [r.data for r in iter_ledger(path, warn=warnings.append, resume_fields=fast)]
    return records, warnings


def test_a_record_carries_its_settings_tags_and_identities_as_objects(tmp_path: Path) -> None:
    met = ExpectationResult(expectation="contains", expected="Hello", passed=True, seen="'Hi'")
    _, line = record_one(tmp_path, steps=1, expectations=(met,))
    record = json.loads(line)

    assert record["schema"] == SCHEMA_VERSION == 2
    assert record["tags"] == ["smoke", "short"]
    assert record["settings"] == {
        "model": {"path": None, "hf_id": None, "revision": None, "served_name": "demo"},
        "vllm": {
            "tensor_parallel_size": 1,
            "data_parallel_size": 1,
            "max_model_len": 8192,
            "enable_tool_calling": True,
            "tool_call_parser": "hermes",
            "extra_args": [],
        },
        "generation": {"max_tokens": 512, "temperature": 0.7},
        "agent": {"recursion_limit": 12},
    }
    assert record["model_identity"] == {
        "kind": "standin",
        "persona": "helpful",
        "latency_ms": 20,
        "load_s": 0.0,
        "seed": 0,
        "substitute_model": "",
        "rate_limit_rpm": 0,
        "recursion_flag": True,
    }
    assert record["backend_identity"] == {
        "kind": "standin",
        "module": "pytest_haico.standins.backend",
        "version": "0.1.0",
    }
    assert record["turns"][0]["expectations"] == [
        {"expectation": "contains", "expected": "Hello", "passed": True, "seen": "'Hi'"}
    ]


def test_the_fields_the_fast_readers_match_lead_the_line_in_their_old_order(
    tmp_path: Path,
) -> None:
    _, line = record_one(tmp_path)
    keys = list(json.loads(line))
    old = keys.index("duration_s")
    assert keys[: old + 1] == list(json.loads(SCHEMA_1_LINE))[: old + 1]
    assert {"tags", "settings"} <= set(keys[old + 1 :])


def test_schema_1_identities_parse_into_the_objects_schema_2_writes(tmp_path: Path) -> None:
    old = json.loads(SCHEMA_1_LINE)
    _, line = record_one(tmp_path)
    new = json.loads(line)
    assert parse_model_identity(old["model_identity"]) == new["model_identity"]
    assert parse_backend_identity(old["backend_identity"]) == new["backend_identity"]


@pytest.mark.parametrize("fast", [False, True], ids=["full-parse", "resume-fast-path"])
def test_schema_1_and_2_records_are_read_alike(tmp_path: Path, fast: bool) -> None:
    spec, line = record_one(tmp_path)
    path = tmp_path / "mixed.jsonl"
    path.write_bytes(SCHEMA_1_LINE + line)

    records, warnings = read_all(path, fast=fast)

    assert warnings == []
    assert [(r["schema"], r["item_id"], r["attempt"], r["verdict"]) for r in records] == [
        (1, "9f" * 32, 1, "completed"),
        (2, spec.item_id, 1, "completed"),
    ]
    index = ResumeIndex()
    index.add_all(iter_ledger_dir(tmp_path, warn=pytest.fail, resume_fields=fast), warn=pytest.fail)
    assert len(index) == 2 and all(index.get(r["item_id"]).done for r in records)  # type: ignore[union-attr]


def test_item_times_count_schema_1_and_2_records(tmp_path: Path) -> None:
    _, line = record_one(tmp_path)
    (tmp_path / "ledger").mkdir()
    (tmp_path / "ledger" / "a.jsonl").write_bytes(SCHEMA_1_LINE + line)

    times = ItemTimes.from_ledger_dir(tmp_path / "ledger", warn=pytest.fail)

    measured = times.get("default")
    assert measured is not None and measured.samples == 2


@pytest.mark.parametrize("fast", [False, True], ids=["full-parse", "resume-fast-path"])
@pytest.mark.parametrize("schema", [3, 10])
def test_a_record_of_a_future_schema_is_skipped_with_a_warning(
    tmp_path: Path, fast: bool, schema: int
) -> None:
    # The same shape as a readable line: even the fast path must not take it.
    future = SCHEMA_1_LINE.replace(b'{"schema":1,', b'{"schema":%d,' % schema)
    path = tmp_path / "run.jsonl"
    path.write_bytes(future + SCHEMA_1_LINE)

    records, warnings = read_all(path, fast=fast)

    assert [r["schema"] for r in records] == [1]
    assert warnings == [
        f"{path}:1: skipped a record of schema {schema}, newer than this pytest-haico reads "
        "(2); upgrade pytest-haico"
    ]


@pytest.mark.parametrize("schema", [b"0", b"true", b'"1"', b"null"])
def test_a_record_without_a_known_schema_is_skipped(tmp_path: Path, schema: bytes) -> None:
    path = tmp_path / "run.jsonl"
    path.write_bytes(SCHEMA_1_LINE.replace(b'{"schema":1,', b'{"schema":' + schema + b","))

    records, warnings = read_all(path)

    assert records == []
    assert warnings == [
        f"{path}:1: skipped a record without a known schema ({json.loads(schema)!r})"
    ]
