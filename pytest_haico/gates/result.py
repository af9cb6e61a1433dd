"""A gate's result, running gates in order, and what a run leaves of them: gates.json, the
failure line and the `--haico-gates-only` table."""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from pytest_haico.errors import StackError
from pytest_haico.files import write_atomic
from pytest_haico.redact import Redactor

GATES_SCHEMA = 1
# What a gate that raised instead of answering is told to do: it is a bug, not a verdict.
_BUG_FIX = (
    "this is a bug in pytest-haico, not in the run: report it with the message above; "
    "--haico-gates-only repeats the gates without running items"
)

Clock = Callable[[], float]


@dataclass(frozen=True)
class GateResult:
    """One gate's verdict: why it passed or failed (`detail`), how to fix a failure (`fix`)."""

    name: str
    passed: bool
    detail: str
    fix: str = ""
    seconds: float = 0.0

    @property
    def failure_line(self) -> str:
        """``gate <name> failed: <why>; <how to fix>`` (the one line a failed run prints)."""
        return failure_line(self)


class GateFailedError(StackError):
    """A preflight gate failed: the message is its failure line (which gate, why, how to
    fix); `results` holds every gate run so far, the failed one last."""

    def __init__(self, message: str, *, results: Sequence[GateResult]) -> None:
        self.results = tuple(results)
        super().__init__(message)

    @property
    def brief(self) -> str:
        """The failed gate by name only, for the item's error and pytest's stop line: the
        whole failure line is printed once, in the haico summary."""
        gate = next((result.name for result in self.results if not result.passed), "?")
        return f"gate {gate} failed (why and the fix: the haico summary)"


def passed(name: str, detail: str) -> GateResult:
    """A passed gate; `detail` says what was seen."""
    return GateResult(name=name, passed=True, detail=detail)


def failed(name: str, why: str, fix: str) -> GateResult:
    """A failed gate: `why` it failed and exactly what the user does about it."""
    return GateResult(name=name, passed=False, detail=why, fix=fix)


@dataclass(frozen=True)
class Gate:
    """A static gate ready to run: its name and a call with every input bound
    (``Gate(static.ONE_NODE, functools.partial(static.check_one_node, os.environ))``)."""

    name: str
    check: Callable[[], GateResult]


@dataclass(frozen=True)
class AsyncGate:
    """A dynamic gate ready to run: its name and a coroutine function with its inputs bound."""

    name: str
    check: Callable[[], Awaitable[GateResult]]


def run_gates(
    gates: Iterable[Gate], *, redactor: Redactor | None = None, clock: Clock = time.monotonic
) -> tuple[GateResult, ...]:
    """Run `gates` in order, timing each; stop after the first failure.

    Returns every result so far: the last one is the failure, if any. A gate that raises
    is a failure naming the exception (`Exception` only: Ctrl-C still interrupts).
    Details and fixes pass `redactor`, so nothing downstream can leak a secret.
    """
    results: list[GateResult] = []
    for gate in gates:
        started = clock()
        try:
            result = gate.check()
        except Exception as exc:
            result = _raised(gate.name, exc)
        results.append(_finish(result, gate.name, clock() - started, redactor))
        if not results[-1].passed:
            break
    return tuple(results)


async def arun_gates(
    gates: Iterable[AsyncGate], *, redactor: Redactor | None = None, clock: Clock = time.monotonic
) -> tuple[GateResult, ...]:
    """`run_gates` for dynamic gates, one after the other on the running loop."""
    results: list[GateResult] = []
    for gate in gates:
        started = clock()
        try:
            result = await gate.check()
        except Exception as exc:
            result = _raised(gate.name, exc)
        results.append(_finish(result, gate.name, clock() - started, redactor))
        if not results[-1].passed:
            break
    return tuple(results)


def first_failure(results: Iterable[GateResult]) -> GateResult | None:
    """The first failed result, or None when every gate run passed."""
    return next((result for result in results if not result.passed), None)


def _raised(name: str, exc: Exception) -> GateResult:
    return failed(name, f"the gate raised {type(exc).__name__}: {exc}", _BUG_FIX)


def _finish(result: GateResult, name: str, seconds: float, redactor: Redactor | None) -> GateResult:
    if redactor is not None:
        result = replace(
            result, detail=redactor.redact(result.detail), fix=redactor.redact(result.fix)
        )
    # The gate's name in the run is the one it was registered under.
    return replace(result, name=name, seconds=round(seconds, 3))


def failure_line(result: GateResult) -> str:
    """``gate <name> failed: <why>; <how to fix>``."""
    line = f"gate {result.name} failed: {result.detail}"
    return f"{line}; {result.fix}" if result.fix else line


def gates_document(results: Sequence[GateResult]) -> dict[str, object]:
    """What gates.json holds: every gate run so far, in order, and whether all passed."""
    failure = first_failure(results)
    return {
        "schema": GATES_SCHEMA,
        "passed": failure is None,
        "failed_gate": None if failure is None else failure.name,
        "gates": [asdict(result) for result in results],
    }


def write_gates_json(
    path: Path,
    results: Sequence[GateResult],
    *,
    file_mode: int,
    redactor: Redactor | None = None,
) -> None:
    """Write gates.json whole or not at all (temporary name, fsync, rename), with `file_mode`."""
    document: object = gates_document(results)
    if redactor is not None:
        document = redactor.redact_json(document)
    write_atomic(path, json.dumps(document, indent=2).encode() + b"\n", mode=file_mode)


def render_table(results: Sequence[GateResult]) -> str:
    """The `--haico-gates-only` table: gate, ok/FAILED, seconds, detail; a failure's fix below."""
    header = ("gate", "result", "seconds", "detail")
    rows = [(r.name, "ok" if r.passed else "FAILED", f"{r.seconds:.2f}", r.detail) for r in results]
    name_width = max([len(header[0]), *(len(row[0]) for row in rows)])
    seconds_width = max([len(header[2]), *(len(row[2]) for row in rows)])
    lines = [
        f"{name:<{name_width}}  {result:<6}  {seconds:>{seconds_width}}  {detail}".rstrip()
        for name, result, seconds, detail in (header, *rows)
    ]
    failure = first_failure(results)
    if failure is not None and failure.fix:
        lines.append(f"fix ({failure.name}): {failure.fix}")
    return "\n".join(lines)
