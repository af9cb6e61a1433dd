"""The HTML report's plots: small multiples, one series per panel (no legend to overlap),
each an inline PNG, drawn only for a series with `MIN_POINTS` points or more."""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Iterator, Sequence
from typing import Any

from pytest_haico.ledger.verdicts import MEASURED_VERDICTS
from pytest_haico.report.allocation import RunAllocation
from pytest_haico.report.cost import MIN_ITEMS
from pytest_haico.report.data import Report

# A series with fewer points is listed, not plotted: the 5 measured items `haico cost`
# needs before it projects (a trend or a histogram of 1-4 points says nothing).
MIN_POINTS = MIN_ITEMS
_PANEL_INCHES = (3.6, 2.2)


def pyplot_module() -> Any:
    """matplotlib's pyplot on the Agg backend (imported when the first plot is drawn)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    return pyplot


def _png(figure: Any) -> str:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=90, bbox_inches="tight")
    pyplot_module().close(figure)
    return base64.b64encode(buffer.getvalue()).decode()


def panel(title: str, caption: str, figure: Any) -> str:
    """One small multiple: a figure of one series, its title in the caption."""
    return (
        f'<figure class="panel" data-series="{html.escape(title)}">'
        f'<img alt="{html.escape(title)}" src="data:image/png;base64,{_png(figure)}">'
        f"<figcaption>{html.escape(caption)}</figcaption></figure>"
    )


def _axes() -> tuple[Any, Any]:
    figure, axes = pyplot_module().subplots(figsize=_PANEL_INCHES)
    axes.spines[["top", "right"]].set_visible(False)
    return figure, axes


def _multiples(panels: list[str], skipped: Sequence[str], what: str) -> str:
    out = [f'<div class="multiples">{"".join(panels)}</div>'] if panels else []
    if skipped:
        out.append(
            f'<p class="note">Not plotted, fewer than {MIN_POINTS} {what}: '
            + html.escape(", ".join(skipped))
            + ".</p>"
        )
    return "".join(out) or '<p class="note">Nothing to plot.</p>'


def distributions(report: Report) -> str:
    """Item seconds per arm × stratum: a histogram each, on one shared x range."""
    full = [c for c in report.cells if len(c.durations) >= MIN_POINTS]
    skipped = [f"{c.arm} × {c.stratum} ({len(c.durations)})" for c in report.cells if c not in full]
    top = max((max(c.durations) for c in full), default=1.0) or 1.0
    panels = []
    for cell in full:
        figure, axes = _axes()
        axes.hist(cell.durations, bins=min(30, max(5, len(cell.durations) // 3)), range=(0, top))
        axes.set_xlabel("item seconds")
        axes.set_ylabel("items")
        title = f"{cell.arm} × {cell.stratum}"
        panels.append(panel(title, f"{title}: {len(cell.durations)} items", figure))
    return _multiples(panels, skipped, "measured items")


def cost_trend(report: Report) -> str:
    """Item seconds against item order (by start time) per arm × stratum: the trend
    `haico cost` warns about."""
    panels, skipped = [], []
    for cell in report.cells:
        timed = sorted(
            (str(r.data.get("started_at")), r.duration_s or 0.0)
            for r in report.results.records
            if r.arm == cell.arm and r.stratum == cell.stratum and r.verdict in MEASURED_VERDICTS
        )
        title = f"{cell.arm} × {cell.stratum}"
        if len(timed) < MIN_POINTS:
            skipped.append(f"{title} ({len(timed)})")
            continue
        figure, axes = _axes()
        axes.plot(range(1, len(timed) + 1), [d for _, d in timed], ".", markersize=5)
        axes.xaxis.get_major_locator().set_params(integer=True)
        axes.set_xlabel("item order (by start time)")
        axes.set_ylabel("item seconds")
        panels.append(panel(title, f"{title}: {len(timed)} attempts", figure))
    return _multiples(panels, skipped, "measured attempts")


def model_load(allocations: list[RunAllocation]) -> str:
    """Per run, the model's requests running and waiting over the run (its sampled
    model-metrics.csv): two panels on one y scale."""
    panels, skipped = [], []
    for run in allocations:
        rows = [s for s in run.samples if s.running is not None]
        title = f"{run.arm} {run.run_id}"
        if not run.samples:
            continue
        if len(rows) < MIN_POINTS:
            skipped.append(f"{title} ({len(rows)})")
            continue
        top = max(max(s.running or 0.0, s.waiting or 0.0) for s in rows) + 1
        for name in ("running", "waiting"):
            figure, axes = _axes()
            values = [getattr(s, name) or 0.0 for s in rows]
            axes.step([s.t_s for s in rows], values, where="post")
            axes.set_ylim(0, top)
            axes.set_xlabel("seconds since sampling began")
            axes.set_ylabel(f"requests {name}")
            panels.append(panel(f"{title} {name}", f"{title}: requests {name}", figure))
    if not panels and not skipped:
        return '<p class="note">No run left a model-metrics.csv.</p>'
    return _multiples(panels, skipped, "samples (one a second)")


def iter_plot_sections(report: Report, allocations: list[RunAllocation]) -> Iterator[str]:
    """The plot sections, each with its heading and what it shows."""
    yield '<section id="distributions"><h2>Item seconds, per arm × stratum</h2>'
    yield distributions(report)
    yield (
        '<p class="note">Newest records that ran to their own end; one panel per arm × '
        "stratum on one x range.</p></section>"
    )
    yield '<section id="cost-trend"><h2>Item cost against item order</h2>'
    yield cost_trend(report)
    yield (
        '<p class="note">Every measured attempt, by start time: a rising trend means early '
        "items underestimate the campaign (as <code>haico cost</code> warns).</p></section>"
    )
    yield '<section id="model-load"><h2>The model\'s requests, running and waiting</h2>'
    yield model_load(allocations)
    yield (
        '<p class="note">Sampled once a second from the model server\'s /metrics '
        "(vllm:num_requests_running, vllm:num_requests_waiting) while the run conversed."
        "</p></section>"
    )
