"""The HTML report's paired comparison section (`haico report B --baseline A`): per stratum
and overall, both pass rates with their intervals, the paired difference, McNemar's p, and
a small plot of the per-stratum differences with their intervals."""

from __future__ import annotations

import html
from collections.abc import Iterator

from pytest_haico.report.html_plots import panel, pyplot_module
from pytest_haico.results.paired import OVERALL, Comparison


def _esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def difference_plot(comparison: Comparison) -> str:
    """B − A per stratum (and overall) in points, a dot and its interval each; 0 marked."""
    strata = comparison.strata
    figure, axes = pyplot_module().subplots(figsize=(4.2, 0.5 + 0.35 * len(strata)))
    axes.spines[["top", "right"]].set_visible(False)
    ys = list(range(len(strata)))[::-1]
    for y, s in zip(ys, strata, strict=True):
        d = s.difference
        low, high = 100 * (d.value - d.low), 100 * (d.high - d.value)
        colour = "#c0392b" if d.high < 0 else ("#2e7d32" if d.low > 0 else "#555")
        axes.errorbar([100 * d.value], [y], xerr=[[low], [high]], fmt="o", color=colour, capsize=3)
    axes.axvline(0, color="#999", linewidth=0.8)
    axes.set_yticks(ys, [s.stratum for s in strata])
    axes.set_xlabel(f"B − A, points ({100 * comparison.confidence:g}% interval)")
    return panel("paired difference", "B − A per stratum, with its interval", figure)


def paired_section(comparison: Comparison, a: str, b: str) -> Iterator[str]:
    """The section: a table per stratum and overall, then the plot."""
    yield '<section id="paired"><h2>Paired comparison, B against A</h2>'
    yield (
        f"<p>A: <code>{_esc(a)}</code>; B: <code>{_esc(b)}</code> (this report); paired by "
        f"{_esc(comparison.unit)}.</p>"
    )
    heads = ("stratum", "pairs", "A pass rate", "B pass rate", "B − A", "McNemar p")
    yield "<table><tr>" + "".join(f"<th>{h}</th>" for h in (*heads, "discordant", "left out"))
    yield "</tr>"
    for s in comparison.strata:
        cells = [
            "overall" if s.stratum == OVERALL else s.stratum,
            f"{s.table.n:,}",
            s.a.text(),
            s.b.text(),
            s.difference.text(),
            f"{s.p:.3g}",
            f"{s.table.lost} pass → fail, {s.table.gained} fail → pass",
            f"{sum(s.left_out.values())}; unpaired {s.only_a} A, {s.only_b} B",
        ]
        yield "<tr>" + "".join(f"<td>{_esc(c)}</td>" for c in cells) + "</tr>"
    yield "</table>"
    yield f'<div class="multiples">{difference_plot(comparison)}</div>'
    yield (
        '<p class="note">Wilson intervals on the rates; Newcombe\'s interval on the paired '
        "difference; McNemar's exact test on the discordant pairs. Items that were "
        "infrastructure failures (or substituted) in either run are left out.</p></section>"
    )
