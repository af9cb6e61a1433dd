"""A run's stack start-up as `haico cost` and `haico report` measure it."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

from pytest_haico.files import read_results_file
from pytest_haico.ledger.layout import CLAIM_FILE, RUN_CONFIG_JSON

_DAY_S = 86400.0


def run_startup_s(run_dir: Path, first_started_at: str) -> float | None:
    """A run's stack start-up: from its claim of its directory (`claim.json`, written as the
    session starts) to its first item's start, which covers the stack's start and the gates.
    None when the run does not say, or when it was attached to a kept stack (`KEPT_STACK` in
    its run-config): it started none."""
    try:
        claim = json.loads(read_results_file(run_dir / CLAIM_FILE))
        started = datetime.fromisoformat(first_started_at).timestamp()
        seconds = started - float(claim["claimed_at"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not 0 <= seconds < _DAY_S or _attached(run_dir):
        return None
    return seconds


def _attached(run_dir: Path) -> bool:
    try:
        data = json.loads(read_results_file(run_dir / RUN_CONFIG_JSON))
    except (OSError, ValueError):
        return False
    values = data.get("values", data) if isinstance(data, dict) else {}
    return isinstance(values, dict) and "KEPT_STACK" in values
