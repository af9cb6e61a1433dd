"""pytest-haico: campaigns of scripted LLM conversations as one pytest session."""

from __future__ import annotations

from pytest_haico.errors import (
    ConfigError,
    GateError,
    HaicoError,
    InfraError,
    RateLimitedError,
    StackError,
)
from pytest_haico.verdicts import Outcome, Verdict

__version__ = "0.1.0"

__all__ = [
    "ConfigError",
    "GateError",
    "HaicoError",
    "InfraError",
    "Outcome",
    "RateLimitedError",
    "StackError",
    "Verdict",
    "__version__",
]
