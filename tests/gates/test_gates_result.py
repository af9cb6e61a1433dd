"""Running gates in order, and what a run leaves of them: gates.json, the line, the table."""

from __future__ import annotations

import itertools
import json
import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from pytest_haico.gates.result import (
    AsyncGate,
    Gate,
    GateResult,
    arun_gates,
    failed,
    failure_line,
    first_failure,
    passed,
    render_table,
    run_gates,
    write_gates_json,
)
from pytest_haico.redact import Redactor


def ticking_clock(step: float = 0.25) -> Callable[[], float]:
    counter = itertools.count()
    return lambda: next(counter) * step


def test_gates_run_in_order_timed_until_the_first_failure() -> None:
    ran: list[str] = []

    def gate(name: str, ok: bool) -> Gate:
        def check() -> GateResult:
            ran.append(name)
            return passed(name, "fine") if ok else failed(name, "broken", "mend it")

        return Gate(name, check)

    results = run_gates(
        [gate("a", True), gate("b", False), gate("c", True)],
        clock=ticking_clock(),
    )
    assert ran == ["a", "b"]
    assert [(r.name, r.passed, r.seconds) for r in results] == [
        ("a", True, 0.25),
        ("b", False, 0.25),
    ]
    assert first_failure(results) == results[-1]


def test_a_gate_that_raises_is_a_failure_naming_the_exception() -> None:
    def boom() -> GateResult:
        raise KeyError("missing")

    (result,) = run_gates([Gate("boom", boom), Gate("never", lambda: passed("never", ""))])
    assert not result.passed
    assert result.detail == "the gate raised KeyError: 'missing'"
    assert "bug in pytest-haico" in result.fix


def test_the_registered_name_wins_and_secrets_are_redacted() -> None:
    redactor = Redactor(["s3cret"])
    check = Gate("served_model", lambda: failed("other", "key s3cret refused", "use s3cret"))
    (result,) = run_gates([check], redactor=redactor)
    assert (result.name, result.detail, result.fix) == (
        "served_model",
        "key [REDACTED] refused",
        "use [REDACTED]",
    )


@pytest.mark.asyncio
async def test_async_gates_run_in_order_until_the_first_failure() -> None:
    async def ok() -> GateResult:
        return passed("x", "fine")

    async def bad() -> GateResult:
        return failed("y", "broken", "mend it")

    async def boom() -> GateResult:
        raise RuntimeError("down")

    results = await arun_gates([AsyncGate("ok", ok), AsyncGate("bad", bad), AsyncGate("z", ok)])
    assert [(r.name, r.passed) for r in results] == [("ok", True), ("bad", False)]
    (raised,) = await arun_gates([AsyncGate("boom", boom)])
    assert raised.detail == "the gate raised RuntimeError: down"


def test_the_failure_line_names_the_gate_why_and_fix() -> None:
    result = failed("walltime", "the job ends in 5 min", "resubmit with a longer --time")
    assert failure_line(result) == (
        "gate walltime failed: the job ends in 5 min; resubmit with a longer --time"
    )
    assert result.failure_line == failure_line(result)


def test_gates_json_holds_every_gate_run_written_atomically_with_the_mode(tmp_path: Path) -> None:
    path = tmp_path / "gates.json"
    path.write_text("old")
    results = [
        GateResult("one_node", True, "SLURM_JOB_NUM_NODES=1", "", 0.001),
        GateResult("walltime", False, "too short, token abc123", "ask for more", 0.002),
    ]
    old_umask = os.umask(0o077)
    try:
        write_gates_json(path, results, file_mode=0o640, redactor=Redactor(["abc123"]))
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    assert json.loads(path.read_text()) == {
        "schema": 1,
        "passed": False,
        "failed_gate": "walltime",
        "gates": [
            {
                "name": "one_node",
                "passed": True,
                "detail": "SLURM_JOB_NUM_NODES=1",
                "fix": "",
                "seconds": 0.001,
            },
            {
                "name": "walltime",
                "passed": False,
                "detail": "too short, token [REDACTED]",
                "fix": "ask for more",
                "seconds": 0.002,
            },
        ],
    }
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gates.json"], "a temporary was left"


def test_the_gates_only_table_lists_name_result_seconds_detail_and_the_fix() -> None:
    results = [
        GateResult("prohibited_environment", True, "OPENAI_ENDPOINT_URL unset", "", 0.0004),
        GateResult("walltime", False, "the job ends in 5 min", "ask for more", 1.5),
    ]
    assert render_table(results).splitlines() == [
        "gate                    result  seconds  detail",
        "prohibited_environment  ok         0.00  OPENAI_ENDPOINT_URL unset",
        "walltime                FAILED     1.50  the job ends in 5 min",
        "fix (walltime): ask for more",
    ]
