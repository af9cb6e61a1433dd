"""`haico report --html`: one self-contained page (no network: plots are inline PNG, the
filters a small inline script) over the full width of the window. Its first screen is the
summary: the pass rate per arm × stratum, failures first, and where the allocation went;
then small multiples of the distributions, the cost trend and the model's load, the runs'
provenance factored into what every run shares and what differs, and every item linked
to its transcript (`html_items`)."""

from __future__ import annotations

import contextlib
import html
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest_haico
from pytest_haico.files import file_kind, shown_path, write_atomic
from pytest_haico.ledger.verdicts import Verdict
from pytest_haico.report.allocation import PARTS, RunAllocation, iter_totals, read_allocations
from pytest_haico.report.data import (
    VERDICT_ORDER,
    Cell,
    Report,
    count,
    factored_provenance,
    seconds,
)
from pytest_haico.report.html_items import (
    MAX_TRANSCRIPTS,
    SCRIPT,
    anchor,
    items_section,
    ordered_items,
)
from pytest_haico.report.html_paired import paired_section
from pytest_haico.report.html_plots import iter_plot_sections
from pytest_haico.report.paired import interval_note, rate_text
from pytest_haico.results import ResultsReadError, require
from pytest_haico.results.paired import Comparison
from pytest_haico.stamps import utc_shown

SECTIONS = (
    "summary",
    "allocation",
    "distributions",
    "cost-trend",
    "model-load",
    "runs",
    "items",
    "transcripts",
)
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
# A paired comparison: its figures, A's path and B's (`haico report --baseline`).
Paired = tuple[Comparison, str, str]
_STYLE = """
body{font-family:system-ui,sans-serif;margin:1em 2em;color:#222}
h1{margin:.2em 0}.path{color:#666;overflow-wrap:anywhere}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:3px 8px}
table.wide{width:100%}th{background:#eef;text-align:left}td.n{text-align:right;white-space:nowrap}
.bar{display:flex;height:1em;min-width:12em}.bar span{display:block;height:100%}
.multiples{display:grid;grid-template-columns:repeat(auto-fill,minmax(340px,1fr));gap:1em}
figure.panel{margin:0}figure.panel img{width:100%}figcaption{font-size:90%;color:#444}
.note{color:#555;font-size:90%}.filters label{margin-right:1.5em}
details{border-top:1px solid #ddd;padding:.3em 0}summary{cursor:pointer}
.turn{border-left:4px solid #88a;margin:1em 0;padding-left:1em}
.user{background:#eef6ff;padding:.5em}.ai{background:#f6f6f6;padding:.5em;white-space:pre-wrap}
.err{color:#b71c1c}code{font-size:90%;overflow-wrap:anywhere}
"""


def check_plotting() -> None:
    """Raise `MissingExtraError` naming the extra when matplotlib is missing."""
    require("matplotlib", "report", "haico report --html")


def _esc(value: object) -> str:
    return html.escape(str(value))


def _row(cells: list[str], numeric: set[int]) -> str:
    return (
        "<tr>"
        + "".join(
            f'<td class="n">{c}</td>' if i in numeric else f"<td>{c}</td>"
            for i, c in enumerate(cells)
        )
        + "</tr>"
    )


def _head(*names: str) -> str:
    return "<tr>" + "".join(f"<th>{_esc(n)}</th>" for n in names) + "</tr>"


def _pass_rate(cell: Cell) -> float:
    return cell.verdicts.get(Verdict.COMPLETED, 0) / cell.items if cell.items else 0.0


def _bar(cell: Cell) -> str:
    spans = "".join(
        f'<span title="{cell.verdicts[v]} {v}" style="background:{_COLOURS.get(v, "#999")};'
        f'width:{100 * cell.verdicts[v] / cell.items:.2f}%"></span>'
        for v in VERDICT_ORDER
        if cell.verdicts.get(v)
    )
    return f'<div class="bar">{spans}</div>'


def _summary(report: Report) -> Iterator[str]:
    cells = sorted(report.cells, key=lambda c: (_pass_rate(c), c.arm, c.stratum))
    first: dict[tuple[str, str], int] = {}  # each cell's first failed item with a transcript
    for index, record in enumerate(ordered_items(report)[:MAX_TRANSCRIPTS]):
        if record.verdict != Verdict.COMPLETED:
            first.setdefault((record.arm, record.stratum), index)
    yield '<section id="summary"><h2>Pass rate per arm × stratum, failures first</h2>'
    yield '<table class="wide">' + _head(
        "arm",
        "stratum",
        "pass rate",
        "items",
        "verdicts",
        "",
        "median",
        "p95",
        "turns",
        "tokens in",
        "tokens out",
        "retries",
        "reruns",
    )
    for cell in cells:
        failing = cell.items - cell.verdicts.get(Verdict.COMPLETED, 0)
        at = first.get((cell.arm, cell.stratum))
        verdicts = _esc(cell.verdict_text())
        if at is not None:
            verdicts += f' (<a href="#{anchor(at)}">{failing} not completed</a>)'
        yield _row(
            [
                _esc(cell.arm),
                _esc(cell.stratum),
                _esc(rate_text(cell.passed, cell.items)),
                count(cell.items),
                verdicts,
                _bar(cell),
                seconds(cell.median_s),
                seconds(cell.p95_s),
                count(cell.turns),
                count(cell.tokens_in),
                count(cell.tokens_out),
                count(cell.retries),
                count(cell.reruns),
            ],
            {2, 3, 6, 7, 8, 9, 10, 11, 12},
        )
    yield (
        f'</table><p class="note">{_esc(interval_note())}. Median and '
        "p95 item seconds of the items that ran to their own end; retries are attempts after "
        "an infrastructure failure or an interruption, reruns records after the item was "
        "done (--haico-no-resume).</p></section>"
    )


def _allocation(allocations: list[RunAllocation]) -> Iterator[str]:
    yield '<section id="allocation"><h2>Where the allocation went</h2>'
    rows = list(iter_totals(allocations))
    if not rows:
        yield '<p class="note">No run left a timeline.json.</p>'
    else:
        yield '<table class="wide">' + _head(
            "",
            "runs",
            "allocation",
            "GPU-hours",
            *PARTS,
            "model idle",
            "requests running",
            "bottleneck",
        )
        for total in rows:
            gpu = "-" if total.gpu_hours is None else f"{total.gpu_hours:.2f}"
            idle = "-" if total.idle_share is None else f"{total.idle_share:.0%}"
            mean = "-" if total.mean_running is None else f"{total.mean_running:.2g}"
            yield _row(
                [
                    _esc(total.label),
                    str(total.runs),
                    seconds(total.allocation_s),
                    gpu,
                    *(f"{total.shares[p]:.0%}" for p in PARTS),
                    idle,
                    mean,
                    _esc(", ".join(total.bottlenecks) or "-"),
                ],
                set(range(1, 10)),
            )
        yield (
            '</table><p class="note">From each run\'s runs/&lt;run_id&gt;/timeline.json: the '
            "allocation from the job's (or process's) start to the exit, the share of it spent "
            "starting (gates and stack), conversing, draining and dumping; model idle: the "
            "share of conversing time the model ran nothing while items remained.</p>"
        )
    for problem in (p for a in allocations for p in a.problems):
        yield f'<p class="err">{_esc(problem)}</p>'
    yield "</section>"


def _runs(report: Report) -> Iterator[str]:
    shared, own = factored_provenance(report.runs)
    yield '<section id="runs"><h2>Runs and provenance</h2>'
    if shared:
        yield (
            "<p>Every run-config shares: "
            + "; ".join(f"<code>{_esc(k)}={_esc(v)}</code>" for k, v in shared.items())
            + "</p>"
        )
    yield '<table class="wide">' + _head("arm", "run", "records", "start-up", "provenance")
    for run, values in zip(report.runs, own, strict=True):
        text = "; ".join(f"<code>{_esc(k)}={_esc(v)}</code>" for k, v in values.items())
        shown = text or ("no run-config.json" if not run.config else "as every run")
        yield _row(
            [_esc(run.arm), _esc(run.run_id), count(run.records), seconds(run.startup_s), shown],
            {2, 3},
        )
    yield "</table></section>"


def render_html(report: Report, paired: Paired | None = None) -> str:
    """The page, as text; with `paired` (the comparison, A's path, B's), its section."""
    results = report.results
    allocations = read_allocations(report.runs)
    # The campaign its records name (an arm's or a run's directory is named otherwise).
    campaigns = {str(r.data.get("campaign") or "") for r in report.newest}
    name = campaigns.pop() if len(campaigns) == 1 and "" not in campaigns else results.path.name
    failed = sum(1 for r in report.newest if r.verdict != Verdict.COMPLETED)
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'>",
        "<meta name='viewport' content='width=device-width'>",
        f"<title>{_esc(name)}: haico report</title><style>{_STYLE}</style></head>",
        f"<body><h1>Campaign {_esc(name)}</h1>",
        f'<p><span class="path">haico report of <code>{_esc(shown_path(results.path))}</code>'
        f"</span>, made {utc_shown(datetime.now(UTC))} by pytest-haico {pytest_haico.__version__}: "
        f"{len(report.newest):,} items, {len(results.records):,} records, "
        f"{len(report.runs)} runs, {failed} items not completed, "
        f"{len(results.orphans)} orphan transcripts, {len(results.warnings)} ledger warnings.</p>",
        *_summary(report),
        *(paired_section(*paired) if paired is not None else ()),
        *_allocation(allocations),
        *iter_plot_sections(report, allocations),
        *_runs(report),
        *items_section(report),
        f"<script>{SCRIPT}</script></body></html>",
    ]
    return "\n".join(parts)


def write_html(report: Report, path: Path, *, mode: int, paired: Paired | None = None) -> None:
    """Write the page to `path` (its directory must exist) with file mode `mode`.

    It holds transcripts, so it gets the results' mode whatever the umask, and is written
    whole under a temporary name and renamed over a regular file; anything else at `path`
    (a symlink or a FIFO another user left in a shared /tmp, /dev/null) is refused, never
    written through or replaced.
    """
    text = render_html(report, paired)
    with contextlib.suppress(OSError):  # missing: it is made; unreachable: the write says so
        kind = file_kind(path.lstat().st_mode)
        if kind != "regular file":
            raise ResultsReadError(
                f"cannot write the HTML report {path}: it is a {kind}, not a regular file: "
                "choose another --html path"
            )
    try:
        write_atomic(path, text.encode("utf-8"), mode=mode)
    except OSError as exc:
        raise ResultsReadError(
            f"cannot write the HTML report {path}: [Errno {exc.errno}] {exc.strerror}: "
            "choose another --html path"
        ) from exc
