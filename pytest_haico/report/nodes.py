"""Failures and item times per Slurm node, for `haico report` and `haico cost`: shown when a
campaign's records name more than one node, so that a bad node stands out beside the good
ones."""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Iterator

from pytest_haico.ledger.verdicts import MEASURED_VERDICTS, Verdict
from pytest_haico.percentiles import P95, percentile
from pytest_haico.report.data import count, seconds
from pytest_haico.results import Results

# What `node_lines` reads of a newest record beyond `pytest_haico.results.RECORD_FIELDS`.
NODE_FIELDS = ("slurm",)
_FAILED = (Verdict.INFRA_ERROR, Verdict.GAVE_UP, Verdict.INTERRUPTED)
_OUTSIDE = "(no job)"  # records written outside a Slurm job name no node


def node_lines(results: Results) -> Iterator[str]:
    """A table of every node's records, failures and item times; nothing for one node.

    Records and failures count every attempt; item times are of each item's newest record
    whose conversation ran to its own end (the report's median and p95)."""
    attempts = Counter(a.node or _OUTSIDE for a in results.attempts)
    if len(attempts) < 2:
        return
    failures = Counter((a.node or _OUTSIDE, a.verdict) for a in results.attempts)
    durations: dict[str, list[float]] = {}
    for record in results.newest():
        slurm = record.data.get("slurm")
        node = slurm.get("node") if type(slurm) is dict else None
        duration = record.data.get("duration_s")
        if record.verdict in MEASURED_VERDICTS and isinstance(duration, int | float):
            durations.setdefault(node or _OUTSIDE, []).append(float(duration))
    rows = [("node", "records", *(str(v) for v in _FAILED), "median", "p95")]
    for node in sorted(attempts):
        times = durations.get(node, [])
        rows.append(
            (
                node,
                count(attempts[node]),
                *(count(failures[node, verdict]) for verdict in _FAILED),
                seconds(statistics.median(times) if times else None),
                seconds(percentile(times, P95)),
            )
        )
    yield f"per node ({len(attempts)} nodes; every record names its node, slurm.node):"
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        numbers = (cell.rjust(width) for cell, width in zip(row[1:], widths[1:], strict=True))
        cells = [row[0].ljust(widths[0]), *numbers]
        yield "  " + "  ".join(cells)
    yield (
        "  (records and failures: every attempt on the node; median and p95: item seconds of "
        "the newest records that ran to their own end there)"
    )
