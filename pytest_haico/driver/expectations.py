"""A turn's expectations (a script's `expect:`), checked against its steps: what each one
asked for, whether the turn met it, and what the turn produced instead."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from pytest_haico.config.expect import Expect
from pytest_haico.driver import wire
from pytest_haico.ledger.records import ExpectationResult

# How much of an answer or a tool error a result shows (the whole length is given too).
EXCERPT_CHARS = 120


def check_expectations(
    expect: Expect | None, steps: Sequence[wire.Step]
) -> list[ExpectationResult]:
    """Every expectation `expect` sets, checked on a turn's steps, in the order of `Expect`'s
    keys. The answer is the final step's text; `artifact: false` asks for nothing."""
    if expect is None:
        return []
    results: list[ExpectationResult] = []
    answer = steps[-1].text if steps else ""
    if expect.artifact:
        with_artifact = [n for n, step in enumerate(steps) if step.has_artifact]
        seen = (
            f"an artifact in step {with_artifact[0]}"
            if with_artifact
            else f"no artifact in {_count(len(steps), 'step')}"
        )
        results.append(_result("artifact", True, bool(with_artifact), seen))
    if expect.contains is not None:
        missing = [needle for needle in expect.needles if needle not in answer]
        seen = excerpt(answer)
        if missing and len(expect.needles) > 1:
            seen += ", without " + " and ".join(repr(needle) for needle in missing)
        results.append(_result("contains", expect.contains, not missing, seen))
    if expect.pattern is not None:
        found = expect.pattern.search(answer) is not None
        results.append(_result("matches", expect.matches, found, excerpt(answer)))
    calls = Counter(name for step in steps for name in step.tool_names)
    if expect.tool_called is not None:
        name = expect.tool_called
        results.append(_result("tool_called", name, calls[name] > 0, _calls(calls)))
    if expect.tool_not_called is not None:
        name = expect.tool_not_called
        results.append(_result("tool_not_called", name, calls[name] == 0, _calls(calls)))
    if expect.no_tool_error:
        failed = [n for n, step in enumerate(steps) if step.has_tool_error]
        seen = "no tool error"
        if failed:
            first = failed[0]
            seen = (
                f"{_count(len(failed), 'tool error')}, the first in step {first + 1}: "
                f"{excerpt(steps[first].text)}"
            )
        results.append(_result("no_tool_error", True, not failed, seen))
    if expect.max_steps is not None:
        limit = expect.max_steps
        results.append(_result("max_steps", limit, len(steps) <= limit, _count(len(steps), "step")))
    return results


def describe_failure(turn: int, result: ExpectationResult) -> str:
    """One line: the turn (its index from 0; the message counts from 1), what the
    expectation asked for, what the turn produced."""
    return f"turn {turn + 1}: expected {_asked(result)}, got {result.seen}"


def excerpt(text: str) -> str:
    """The text quoted (cut at `EXCERPT_CHARS`), with its whole length."""
    shown = text if len(text) <= EXCERPT_CHARS else text[:EXCERPT_CHARS] + "…"
    return f"{shown!r} ({_count(len(text), 'char')})"


def _asked(result: ExpectationResult) -> str:
    expected = result.expected
    match result.expectation:
        case "artifact":
            return "an artifact"
        case "contains":
            needles = expected if isinstance(expected, list) else [expected]
            return "the answer to contain " + " and ".join(repr(needle) for needle in needles)
        case "matches":
            return f"the answer to match {expected!r}"
        case "tool_called":
            return f"a call of the tool {expected!r}"
        case "tool_not_called":
            return f"no call of the tool {expected!r}"
        case "no_tool_error":
            return "no tool error"
        case "max_steps":
            return f"at most {_count(expected, 'step')}"
        case "judge":
            return f"the judge to answer yes to {expected!r}"
    return f"{result.expectation}: {expected!r}"


def _result(expectation: str, expected: object, passed: bool, seen: str) -> ExpectationResult:
    return ExpectationResult.model_validate(
        {"expectation": expectation, "expected": expected, "passed": passed, "seen": seen}
    )


def _calls(calls: Counter[str]) -> str:
    if not calls:
        return "no tool call"
    return "calls of " + ", ".join(f"{name!r} ({count}x)" for name, count in calls.most_common())


def _count(number: object, noun: str) -> str:
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"
