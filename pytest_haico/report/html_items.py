"""The HTML report's items: a table of every item (failures first) with filters by arm,
stratum and verdict (a small inline script over data attributes), each linked to its
transcript, rendered turn by turn in a `<details>`."""

from __future__ import annotations

import html
import json
from collections.abc import Iterator
from typing import Any

from pytest_haico.ledger.verdicts import Verdict
from pytest_haico.report.data import Report, seconds
from pytest_haico.results import Record, ResultsReadError

# The items listed, and those of them whose transcript is rendered (failures come first).
MAX_ITEMS = 5000
MAX_TRANSCRIPTS = 500
FILTERS = ("arm", "stratum", "verdict")
# Hides what the filters leave out; opens the transcript a link (or the address) names.
# The page ends with it, after the elements it finds.
SCRIPT = """
const pick = () => Object.fromEntries([...document.querySelectorAll('select[data-filter]')]
  .map(s => [s.dataset.filter, s.value]));
document.querySelectorAll('select[data-filter]').forEach(s => s.addEventListener('change', () => {
  const want = pick();
  document.querySelectorAll('[data-verdict]').forEach(el => {
    el.hidden = Object.entries(want).some(([k, v]) => v && el.dataset[k] !== v);
  });
}));
const openTarget = () => {
  const el = location.hash && document.getElementById(location.hash.slice(1));
  if (el && el.tagName === 'DETAILS') { el.open = true; el.scrollIntoView(); }
};
window.addEventListener('hashchange', openTarget); openTarget();
"""


def _esc(value: object) -> str:
    return html.escape(str(value))


def ordered_items(report: Report) -> list[Record]:
    """Each item's newest record, failures first, then by arm, stratum, script, repeat."""
    return sorted(
        report.newest,
        key=lambda r: (r.verdict == Verdict.COMPLETED, r.arm, r.stratum, r.script, r.repeat),
    )


def anchor(index: int) -> str:
    return f"item-{index}"


def _data(record: Record) -> str:
    return "".join(
        f' data-{name}="{_esc(value)}"'
        for name, value in (
            ("arm", record.arm),
            ("stratum", record.stratum),
            ("verdict", record.verdict),
        )
    )


def _label(record: Record) -> str:
    return f"{record.script}-r{record.repeat}"


def _error(record: Record) -> str:
    error = record.data.get("error")
    if isinstance(error, dict):
        return f"{error.get('kind')}: {error.get('message')}"
    return ""


def _filters(items: list[Record]) -> str:
    out = ['<p class="filters">']
    for name in FILTERS:
        values = sorted({str(getattr(r, name)) for r in items})
        options = "".join(f'<option value="{_esc(v)}">{_esc(v)}</option>' for v in values)
        out.append(
            f'<label>{name} <select data-filter="{name}"><option value="">all</option>'
            f"{options}</select></label> "
        )
    return "".join(out) + "</p>"


def items_section(report: Report) -> Iterator[str]:
    """The item table (with its filters) and the transcripts it links to."""
    items = ordered_items(report)
    shown = items[:MAX_ITEMS]
    yield f'<section id="items"><h2>Items ({len(items):,}), failures first</h2>'
    yield _filters(shown)
    yield (
        '<table class="wide items"><tr><th>item</th><th>arm</th><th>stratum</th>'
        "<th>verdict</th><th>item seconds</th><th>turns</th><th>error</th></tr>"
    )
    for index, record in enumerate(shown):
        name = _esc(_label(record))
        link = f'<a href="#{anchor(index)}">{name}</a>' if index < MAX_TRANSCRIPTS else name
        turns = record.data.get("turns")
        yield (
            f"<tr{_data(record)}><td>{link}</td><td>{_esc(record.arm)}</td>"
            f"<td>{_esc(record.stratum)}</td><td>{_esc(record.verdict)}</td>"
            f'<td class="n">{seconds(record.duration_s)}</td>'
            f'<td class="n">{len(turns) if isinstance(turns, list) else "-"}</td>'
            f'<td class="err">{_esc(_error(record))}</td></tr>'
        )
    yield "</table>"
    if len(items) > len(shown):
        yield f'<p class="note">The first {MAX_ITEMS:,} of {len(items):,} items listed.</p>'
    yield "</section>"
    yield '<section id="transcripts"><h2>Transcripts</h2>'
    for index, record in enumerate(shown[:MAX_TRANSCRIPTS]):
        title = f"{record.arm} {_label(record)}: {record.verdict}"
        yield f'<details id="{anchor(index)}"{_data(record)}><summary>{_esc(title)}</summary>'
        if _error(record):
            yield f'<p class="err">{_esc(_error(record))}</p>'
        yield f"<p><small><code>{_esc(record.transcript_path)}</code></small></p>"
        yield from transcript(report, record)
        yield "</details>"
    if len(items) > MAX_TRANSCRIPTS:
        yield (
            f'<p class="note">Transcripts of the first {MAX_TRANSCRIPTS} items (failures '
            "first); <code>haico show ITEM</code> prints any other.</p>"
        )
    yield "</section>"


def transcript(report: Report, record: Record) -> Iterator[str]:
    try:
        events = report.results.transcript(record)
    except ResultsReadError as exc:
        yield f'<p class="err">{_esc(exc)}</p>'
        return
    turns: dict[int, list[dict[str, Any]]] = {}
    for event in events:
        turn = event.get("turn")
        turns.setdefault(turn if isinstance(turn, int) else -1, []).append(event)
    for index in sorted(turns):  # indices from 0, as transcripts store them; headings from 1
        heading = f"turn {index + 1}" if index >= 0 else "outside a turn"
        yield f'<div class="turn"><h4>{heading}</h4>'
        for event in turns[index]:
            yield from _event(event)
        yield "</div>"


def _event(event: dict[str, Any]) -> Iterator[str]:
    kind = event.get("kind")
    if kind == "request":
        query = (event.get("body") or {}).get("query", "")
        yield f'<div class="user"><b>user:</b> {_esc(query)}</div>'
    elif kind == "event":
        data = event.get("data") or {}
        if data.get("type") == "step":
            step = data.get("step") or {}
            calls = step.get("tool_calls") or []
            text = step.get("content") or ""
            extra = f" <i>tool calls: {_esc(json.dumps(calls))[:300]}</i>" if calls else ""
            bad = ' <b class="err">tool error</b>' if step.get("tool_error") else ""
            yield f'<div class="ai"><b>{_esc(step.get("message_type", "step"))}:</b> ' + (
                f"{_esc(text) or '<i>(empty)</i>'}{extra}{bad}</div>"
            )
        elif data.get("type") == "complete":
            yield (
                f"<p>complete: usage {_esc(json.dumps(data.get('usage')))}, recursion limit "
                f"reached: {_esc(data.get('recursion_limit_reached'))}</p>"
            )
        elif data.get("type") == "error":
            yield f'<p class="err">error ({_esc(data.get("kind"))}): {_esc(data.get("error"))}</p>'
    elif kind == "finding":
        error = event.get("error")
        message = (error.get("message") if isinstance(error, dict) else None) or ""
        yield f'<p class="err"><b>{_esc(event.get("verdict", "finding"))}:</b> {_esc(message)}</p>'
    elif kind == "response":
        yield f"<p><small>HTTP {_esc(event.get('status'))}</small></p>"
    elif kind not in ("snapshot",):
        yield f"<p><small>{_esc(json.dumps(event)[:300])}</small></p>"
