"""pytest-haico: campaigns of scripted LLM conversations as one pytest session.

The package's parts, and which way their imports run (a test enforces it):

    plugin.py, fixtures.py   pytest's entry point and the fixtures: may import every part
    campaign/    the session's hooks: setup, selection, recording, summary, signals
    runner/      conversations in flight, breaker, one stack + runner per arm
    driver/      one conversation over the backend's wire, and its verdict
    stack/       services, ports, Postgres, janitor, profiles
    ledger/      records, verdicts, durable append, resume, recorder, run directories
    config/      settings, arms and scripts, cluster.env, items and identity
    provenance/  what a run leaves for later: pg_dumps, run-config.env/.json
    gates/       the preflight gates, each a small timed check (config and ledger only)
    results/     the results API: a campaign's records as objects or DataFrames (config only)
    cli/         the `haico` command: cost, staged and journaled submission, report, compare,
                 init (config, ledger and results), and the kept stack (stack, provenance)
    standins/    the local profile's model server and backend, reached over HTTP only

campaign may import every part but the stand-ins; runner may import driver, stack, ledger,
provenance and config; provenance imports stack and config; driver imports config and the
ledger's record types; stack and ledger import config; config imports nothing of the
others. The shared helpers `errors` and `redact` may be imported by every part, the
stand-ins included; no other core module imports a stand-in, and the stand-ins import
nothing else of the core.

The public names below load on first use, so that `import pytest_haico` (which every
pytest start does, through the plugin's entry point) stays cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from pytest_haico.errors import (
    ConfigError,
    HaicoError,
    InfraError,
    RateLimitedError,
    StackError,
)

if TYPE_CHECKING:
    from pytest_haico.config.items import ItemSpec
    from pytest_haico.ledger.verdicts import Outcome, Verdict
    from pytest_haico.runner.arm_run import HaicoStack
    from pytest_haico.runner.finished import Conversation

__version__ = "0.1.0"

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
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'pytest_haico' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
