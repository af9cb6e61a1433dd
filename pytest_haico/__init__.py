"""pytest-haico: campaigns of scripted LLM conversations as one pytest session.

The package's parts are its folders; docs/how-it-works.md has the table of what each holds
and may import, which `tests/test_architecture.py` enforces:

    plugin.py, fixtures.py   pytest's entry point and the fixtures: may import every part
    reference.py             the documentation's generated reference pages: may import every part
    campaign/    the session's hooks: setup, selection, recording, summary, signals
    runner/      conversations in flight, breaker, one stack + runner per arm
    driver/      one conversation over the backend's wire, and its verdict
    stack/       services, ports, Postgres, janitor, profiles
    ledger/      records, verdicts, durable append, resume, recorder, run directories
    config/      settings, arms and scripts, cluster.env, items and identity
    provenance/  what a run leaves for later: pg_dumps, run-config.env/.json
    gates/       the preflight gates, each a small timed check
    slurm/       the only caller of Slurm's commands
    results/     the results API: a campaign's records as objects or DataFrames
    report/      the report's figures, compare, the cost model
    submit/      frozen inputs, journal, a stage's jobs, continuation
    kept/        a stack kept up between runs by a supervisor
    site/        the cluster's house-keeping: the vLLM venv, the images' SIFs, the GPU check
    cli/         the `haico` command: parsing and printing, one module per command
    standins/    the local profile's model server and backend, reached over HTTP only

The shared helpers may be imported by every part, the stand-ins included: `errors` and the
bottom layer (`redact`, `files`, `procfs`, `durations`, `stamps`, `percentiles`, `locks`,
`httpclient`), which imports nothing of the package but `errors` and itself. No other core
module imports a stand-in, and the stand-ins import nothing else of the core.

The public names below load on first use, so that `import pytest_haico` (which every
pytest start does, through the plugin's entry point) stays cheap.
"""

from __future__ import annotations

import importlib
import time
from typing import TYPE_CHECKING, Any

from pytest_haico.errors import (
    ConfigError,
    HaicoError,
    InfraError,
    RateLimitedError,
    StackError,
)

if TYPE_CHECKING:
    __version__: str
    from pytest_haico.config.items import ItemSpec
    from pytest_haico.ledger.verdicts import Outcome, Verdict
    from pytest_haico.runner.arm_run import HaicoStack
    from pytest_haico.runner.finished import Conversation


# When this process loaded pytest-haico: a pytest process does at its start, through the
# plugin's entry point (`ledger.timeline.process_started_at` falls back on it).
LOADED_AT = time.time()

_LAZY = {
    "Conversation": "pytest_haico.runner.finished",
    "HaicoStack": "pytest_haico.runner.arm_run",
    "ItemSpec": "pytest_haico.config.items",
    "Outcome": "pytest_haico.ledger.verdicts",
    "Verdict": "pytest_haico.ledger.verdicts",
}

__all__ = [
    "ConfigError",
    "Conversation",
    "HaicoError",
    "HaicoStack",
    "InfraError",
    "ItemSpec",
    "Outcome",
    "RateLimitedError",
    "StackError",
    "Verdict",
    "__version__",
]


def __getattr__(name: str) -> Any:
    if name == "__version__":
        globals()[name] = value = _installed_version()
        return value
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'pytest_haico' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def _installed_version() -> str:
    """The installed distribution's version: pyproject.toml's, the one place it is written
    (importlib.metadata costs 40 ms to import: only a caller that asks pays it)."""
    from importlib import metadata

    try:
        return metadata.version("pytest-haico")
    except metadata.PackageNotFoundError:  # a source tree that was never installed
        return "0+unknown"
