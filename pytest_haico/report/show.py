"""`haico show <id>`: one item's conversation, turn by turn, for the terminal.

The item is named by its item id or its test id: the pytest node id, its part after the
file, or its parameter (`demo-plan-trip-r0`). Its attempts are its records in the order
they finished, numbered from 1. One attempt is shown: the user message of each turn, the
agent's steps and tool calls, the answer, the turn's expectations with pass or fail, its
timings and tokens, then the attempt's verdict. The record gives the figures, the
transcript the messages.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

from pytest_haico.report.data import seconds
from pytest_haico.results import Record, Results, ResultsReadError, TranscriptMissingError
from pytest_haico.stamps import utc_shown

_SHOWN = 600  # characters of a message or tool call shown, at most
_CODES = {"bold": "1", "dim": "2", "red": "31", "green": "32", "yellow": "33", "cyan": "36"}


class _Paint:
    def __init__(self, colour: bool) -> None:
        self.colour = colour

    def __call__(self, style: str, text: str) -> str:
        return f"\033[{_CODES[style]}m{text}\033[0m" if self.colour else text


def attempts_of(results: Results, wanted: str) -> list[Record]:
    """Every record of the item `wanted` names, oldest first; a one-line
    `ResultsReadError` naming the close matches when none does."""
    found = [r for r in results.records if wanted in _names(r)]
    if found:
        return sorted(found, key=lambda r: (r.finished_at, r.run_id, r.attempt))
    forms: dict[str, set[str]] = {}  # what is shown -> what it is matched on
    for record in results.records:
        names = _names(record)
        shown = min(names, key=len)  # the test id's parameter: the shortest to read
        forms.setdefault(shown, set()).update(names)
    scores = {
        shown: max(difflib.SequenceMatcher(None, wanted, form).ratio() for form in matched)
        for shown, matched in forms.items()
    }
    close = sorted((s for s in scores if scores[s] >= 0.6), key=lambda s: -scores[s])[:5]
    hint = f"close matches: {', '.join(close)}" if close else "no id is close"
    raise ResultsReadError(
        f"no item {wanted!r} in {results.path}: {hint} (give an item id or a test id, "
        "as `haico report` and the ledger name them)"
    )


def _names(record: Record) -> set[str]:
    names = {record.item_id}
    nodeid = record.data.get("nodeid")
    if isinstance(nodeid, str):
        last = nodeid.rpartition("::")[2]
        names |= {nodeid, last, last.partition("[")[2].removesuffix("]") or last}
    return names


def show_lines(
    results: Results, attempts: list[Record], number: int, *, colour: bool = False
) -> Iterator[str]:
    """The lines of attempt `number` (from 1) of `attempts`."""
    if not 1 <= number <= len(attempts):
        raise ResultsReadError(
            f"--attempt {number}: the item has {len(attempts)} attempt(s): give 1 to "
            f"{len(attempts)}"
        )
    paint = _Paint(colour)
    record = attempts[number - 1]
    data = record.data
    yield paint("bold", f"{record.arm} {record.script}-r{record.repeat}") + (
        f"  item {record.item_id}  test {data.get('nodeid', '-')}"
    )
    other = " (--attempt N shows another)" if len(attempts) > 1 else ""
    yield (
        f"attempt {number} of {len(attempts)}{other}: run {record.run_id}, started "
        f"{_moment(data.get('started_at'))}, {seconds(record.duration_s)}"
    )
    try:
        events = results.transcript(record)
    except TranscriptMissingError as exc:
        yield paint("yellow", f"no transcript: {exc}")
        events = []
    by_turn: dict[int, list[dict[str, Any]]] = {}
    for event in events:
        if isinstance(event.get("turn"), int):
            by_turn.setdefault(event["turn"], []).append(event)
    turns = [t for t in record.turns if isinstance(t, dict)]
    indices = sorted({t["index"] for t in turns if isinstance(t.get("index"), int)} | {*by_turn})
    figures = {t.get("index"): t for t in turns}
    for index in indices:
        yield ""
        yield from _turn(index, len(indices), by_turn.get(index, []), figures.get(index), paint)
    yield ""
    verdict = record.verdict
    yield "verdict: " + paint("green" if verdict == "completed" else "red", verdict)
    error = data.get("error")
    if isinstance(error, dict):
        yield f"  {error.get('kind', '?')}: {error.get('message', '')}"


def _turn(
    index: int,
    count: int,
    events: list[dict[str, Any]],
    figures: dict[str, Any] | None,
    paint: _Paint,
) -> Iterator[str]:
    branch = figures.get("branch_from") if figures else None
    yield paint("bold", f"turn {index + 1} of {count}") + (
        f" (branched from turn {branch + 1})" if isinstance(branch, int) else ""
    )
    answer = ""
    answer_line = -1
    answer_step = ""
    step = 0
    lines: list[str] = []
    for event in events:
        kind = event.get("kind")
        if kind == "request":
            body = event.get("body")
            query = body.get("query") if isinstance(body, dict) else None
            lines.append(paint("cyan", "  user: ") + _short(query))
        elif kind == "event" and isinstance(event.get("data"), dict):
            payload = event["data"]
            if payload.get("type") == "step" and isinstance(payload.get("step"), dict):
                step += 1
                text = _text(payload["step"].get("content"))
                if text and not payload["step"].get("tool_calls"):
                    answer, answer_line = text, len(lines)
                    kind_of = payload["step"].get("message_type") or "step"
                    answer_step = paint("dim", f"  step {step} [{kind_of}]") + " the answer:"
                lines += _step(step, payload["step"], paint)
            elif payload.get("type") == "error":
                lines.append(
                    paint("red", f"  error ({payload.get('kind', '?')}): ")
                    + _short(payload.get("error"))
                )
        elif kind == "finding":
            lines.append(
                paint("red", f"  finding: {event.get('verdict')}: ")
                + _short((event.get("error") or {}).get("message"))
            )
        elif kind == "cancelled":
            lines.append(paint("yellow", "  cancelled here"))
    if answer:  # the answer's step says so, rather than its text twice
        lines[answer_line] = answer_step
    yield from lines
    if answer:
        yield paint("cyan", "  answer: ") + _short(answer)
    if figures is None:
        yield paint("dim", "  (no figures: the turn did not end)")
        return
    for result in figures.get("expectations") or ():
        passed = bool(result.get("passed"))
        mark = paint("green", "pass") if passed else paint("red", "FAIL")
        expected = json.dumps(result.get("expected"), ensure_ascii=False)
        judge = result.get("judge")
        if isinstance(judge, dict):  # who answered, and what
            said = json.dumps(judge.get("answer"), ensure_ascii=False)
            seen = f" (judge {judge.get('name')}, job {judge.get('job_id')}: {said})"
        else:
            seen = "" if passed else f" (seen: {result.get('seen')})"
        yield f"  expect {result.get('expectation')} {expected}: {mark}{seen}"
    tokens = f"{figures.get('tokens_in') or 0:,} in / {figures.get('tokens_out') or 0:,} out"
    first = figures.get("first_event_s")
    yield paint(
        "dim",
        f"  {seconds(figures.get('latency_s'))} (first event "
        f"{seconds(first if isinstance(first, int | float) else None)}), "
        f"{figures.get('steps', 0)} step(s), {figures.get('tool_calls', 0)} tool call(s), "
        f"{figures.get('tool_errors', 0)} tool error(s), tokens {tokens}",
    )


def _step(number: int, step: dict[str, Any], paint: _Paint) -> Iterator[str]:
    kind = step.get("message_type") or "step"
    text = _text(step.get("content"))
    yield paint("dim", f"  step {number} [{kind}]") + (f" {_short(text)}" if text else "")
    for call in step.get("tool_calls") or ():
        if not isinstance(call, dict):
            continue
        found = call.get("function")
        function: dict[str, Any] = found if isinstance(found, dict) else {}
        name = call.get("name") or function.get("name") or "?"
        arguments = call.get("args", function.get("arguments"))
        shown = arguments if isinstance(arguments, str) else json.dumps(arguments)
        yield f"    tool call {name}({_short(shown)})"
    if step.get("tool_error"):
        yield paint("red", "    tool error: ") + _short(step["tool_error"])
    if step.get("artifact"):
        yield f"    artifact: {_short(json.dumps(step['artifact'], ensure_ascii=False))}"


def _moment(value: Any) -> str:
    try:
        moment = datetime.fromisoformat(str(value))
    except ValueError:
        return "-"
    moment = moment if moment.tzinfo else moment.replace(tzinfo=UTC)
    return utc_shown(moment)


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            b if isinstance(b, str) else str(b.get("text", "")) if isinstance(b, dict) else ""
            for b in content
        )
    return "" if content is None else str(content)


def _short(value: Any) -> str:
    text = " ".join(_text(value).split())
    return text if len(text) <= _SHOWN else text[:_SHOWN] + f"… ({len(text):,} characters)"
