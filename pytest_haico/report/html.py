"""`haico report --html`: one self-contained page (no network: plots are inline PNG) with
the tables, verdicts per arm, item cost against item order, latency distributions, the
runs' provenance and every failed item's transcript, turn by turn."""

from __future__ import annotations

import base64
import html
import io
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from pytest_haico.ledger.verdicts import MEASURED_VERDICTS, Verdict
from pytest_haico.report.data import PROVENANCE_KEYS, VERDICT_ORDER, Report, count, seconds
from pytest_haico.results import Record, ResultsReadError, require

# Failed items rendered with their transcript; the rest are listed by name.
MAX_TRANSCRIPTS = 200
SECTIONS = ("summary", "verdicts", "cost-trend", "latency", "runs", "failed-items")
_COLOURS = {
    Verdict.COMPLETED: "#2e7d32",
    Verdict.EXPECTATION_FAILED: "#f9a825",
    Verdict.BLANK_TURN: "#8d6e63",
    Verdict.RECURSION_LIMIT: "#e65100",
    Verdict.SUBSTITUTED: "#6a1b9a",
    Verdict.GAVE_UP: "#b71c1c",
    Verdict.INFRA_ERROR: "#c62828",
    Verdict.RATE_LIMITED: "#ad1457",
    Verdict.INTERRUPTED: "#546e7a",
}
_STYLE = """
body{font-family:system-ui,sans-serif;margin:2em;color:#222;max-width:1100px}
table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:3px 8px}
th{background:#eef}td.n{text-align:right;white-space:nowrap}
code,h1,small{word-break:break-all}
.turn{border-left:4px solid #88a;margin:1em 0;padding-left:1em}
.user{background:#eef6ff;padding:.5em}.ai{background:#f6f6f6;padding:.5em;white-space:pre-wrap}
.err{color:#b71c1c}code{font-size:90%}img{max-width:100%}
"""


def check_plotting() -> None:
    """Raise `MissingExtraError` naming the extra when matplotlib is missing."""
    require("matplotlib", "report", "haico report --html")


def _figure() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    return pyplot


def _png(figure: Any) -> str:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=80, bbox_inches="tight")
    _figure().close(figure)
    data = base64.b64encode(buffer.getvalue()).decode()
    return f'<img alt="plot" src="data:image/png;base64,{data}">'


def _verdict_plot(report: Report) -> str:
    pyplot = _figure()
    arms = sorted({record.arm for record in report.newest})
    figure, axes = pyplot.subplots(figsize=(8, 0.6 * len(arms) + 1.5))
    left = [0] * len(arms)
    for verdict in VERDICT_ORDER:
        counts = [
            sum(1 for r in report.newest if r.arm == arm and r.verdict == verdict) for arm in arms
        ]
        if any(counts):
            axes.barh(arms, counts, left=left, label=verdict, color=_COLOURS.get(verdict))
            left = [a + b for a, b in zip(left, counts, strict=True)]
    axes.set_xlabel("items (newest record)")
    axes.legend(loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=4, fontsize="small")
    return _png(figure)


def _cost_plot(report: Report) -> str:
    pyplot = _figure()
    cells = [(c.arm, c.stratum) for c in report.cells]
    figure, all_axes = pyplot.subplots(
        len(cells), 1, figsize=(8, 2.2 * len(cells) + 0.5), squeeze=False
    )
    for (arm, stratum), axes in zip(cells, all_axes[:, 0], strict=True):
        timed = sorted(
            (str(r.data.get("started_at")), r.duration_s or 0.0)
            for r in report.results.records
            if r.arm == arm and r.stratum == stratum and r.verdict in MEASURED_VERDICTS
        )
        axes.plot(range(1, len(timed) + 1), [d for _, d in timed], ".", markersize=6)
        axes.xaxis.get_major_locator().set_params(integer=True)
        axes.set_title(f"{arm} × {stratum}", fontsize="small")
        axes.set_ylabel("item s")
    all_axes[-1, 0].set_xlabel("item order (by start time)")
    figure.tight_layout()
    return _png(figure)


def _latency_plot(report: Report) -> str:
    pyplot = _figure()
    figure, axes = pyplot.subplots(figsize=(8, 3.5))
    for cell in report.cells:
        if cell.durations:
            axes.hist(cell.durations, bins=30, alpha=0.6, label=f"{cell.arm} × {cell.stratum}")
    axes.set_xlabel("item seconds (newest records that ran to their own end)")
    axes.set_ylabel("items")
    axes.legend(fontsize="small")
    return _png(figure)


def _esc(value: object) -> str:
    return html.escape(str(value))


def _table(head: tuple[str, ...], rows: Sequence[tuple[str, ...]], numeric: int = 2) -> str:
    out = ["<table><tr>" + "".join(f"<th>{_esc(h)}</th>" for h in head) + "</tr>"]
    for row in rows:
        cells = [
            f'<td class="n">{_esc(c)}</td>' if numeric <= i < len(row) - 1 else f"<td>{c}</td>"
            for i, c in enumerate(row)
        ]
        out.append("<tr>" + "".join(cells) + "</tr>")
    return "".join(out) + "</table>"


def _failed(report: Report) -> list[Record]:
    return [r for r in report.newest if r.verdict != Verdict.COMPLETED]


def _anchor(index: int) -> str:
    return f"item-{index}"


def _summary(report: Report) -> str:
    failed = {id(r): i for i, r in enumerate(_failed(report))}
    rows = []
    for cell in report.cells:
        links = [
            f'<a href="#{_anchor(failed[id(r)])}">{_esc(r.script)}-r{r.repeat}</a>'
            for r in report.newest
            if r.arm == cell.arm and r.stratum == cell.stratum and id(r) in failed
        ][:20]
        rows.append(
            (
                _esc(cell.arm),
                _esc(cell.stratum),
                count(cell.items),
                count(cell.turns),
                seconds(cell.median_s),
                seconds(cell.p95_s),
                count(cell.tokens_in),
                count(cell.tokens_out),
                count(cell.retries),
                count(cell.reruns),
                count(cell.gave_up),
                _esc(cell.verdict_text()) + ("<br>failed: " + ", ".join(links) if links else ""),
            )
        )
    head = (
        "arm",
        "stratum",
        "items",
        "turns",
        "median",
        "p95",
        "tokens in",
        "tokens out",
        "retries",
        "reruns",
        "gave up",
        "verdicts",
    )
    return _table(head, rows)


def _runs(report: Report) -> str:
    rows = []
    for run in report.runs:
        values = "<br>".join(
            f"<code>{_esc(k)}={_esc(run.config[k])}</code>"
            for k in PROVENANCE_KEYS
            if k in run.config
        )
        rows.append(
            (
                _esc(run.arm),
                _esc(run.run_id),
                count(run.records),
                seconds(run.startup_s),
                values or "no run-config.json",
            )
        )
    return _table(("arm", "run", "records", "start-up", "provenance"), rows)


def _transcript(report: Report, record: Record) -> Iterator[str]:
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


def render_html(report: Report) -> str:
    """The page, as text."""
    failed = _failed(report)
    results = report.results
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'>",
        f"<title>haico report: {_esc(results.path.name)}</title><style>{_STYLE}</style></head>",
        f"<body><h1>haico report: {_esc(results.path)}</h1>",
        f"<p>{len(report.newest):,} items, {len(results.records):,} records, "
        f"{len(report.runs)} runs, {len(failed)} items not completed, "
        f"{len(results.orphans)} orphan transcripts, {len(results.warnings)} ledger warnings.</p>",
        '<section id="summary"><h2>Per arm × stratum</h2>',
        _summary(report),
        "<p>Each item's newest record; median and p95 of the items that ran to their own end; "
        "retries are attempts after an infrastructure failure or an interruption, reruns "
        "records after the item was done (--haico-no-resume).</p></section>",
        '<section id="verdicts"><h2>Verdicts per arm</h2>',
        _verdict_plot(report),
        "</section>",
        '<section id="cost-trend"><h2>Item cost against item order</h2>',
        _cost_plot(report),
        "</section>",
        '<section id="latency"><h2>Latency distributions</h2>',
        _latency_plot(report),
        "</section>",
        '<section id="runs"><h2>Runs and provenance</h2>',
        _runs(report),
        "</section>",
        f'<section id="failed-items"><h2>Items not completed ({len(failed)})</h2>',
    ]
    for index, record in enumerate(failed):
        title = f"{record.arm} {record.script}-r{record.repeat}: {record.verdict}"
        parts.append(f'<article id="{_anchor(index)}"><h3>{_esc(title)}</h3>')
        error = record.data.get("error")
        if isinstance(error, dict):
            parts.append(
                f'<p class="err">{_esc(error.get("kind"))}: {_esc(error.get("message"))}</p>'
            )
        parts.append(f"<p><small>{_esc(record.transcript_path)}</small></p>")
        if index < MAX_TRANSCRIPTS:
            parts.extend(_transcript(report, record))
        parts.append("</article>")
    if len(failed) > MAX_TRANSCRIPTS:
        parts.append(f"<p>Transcripts of the first {MAX_TRANSCRIPTS} shown.</p>")
    parts.append("</section></body></html>")
    return "\n".join(parts)


def write_html(report: Report, path: Path) -> None:
    """Write the page to `path` (its directory must exist)."""
    text = render_html(report)
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise ResultsReadError(
            f"cannot write the HTML report {path}: [Errno {exc.errno}] {exc.strerror}: "
            "choose another --html path"
        ) from exc
