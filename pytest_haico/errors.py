"""The exceptions pytest-haico raises, under one base.

HaicoError
├── ConfigError          a malformed arm, script, option or cluster.env (→ pytest.UsageError)
├── InfraError           the stack failed an item (backend or model server down, 5xx, timeout,
│   │                    broken stream, auth refused); a test body may raise it too
│   └── RateLimitedError the backend answered 429
├── StackError           a service failed to start or to stop
└── GateError            a preflight gate failed (exit 78)
"""

from __future__ import annotations


class HaicoError(Exception):
    """Base of every error pytest-haico raises."""


class ConfigError(HaicoError):
    """Bad configuration: names the source, the field, the bad value and what is valid."""

    def __init__(self, source: str, field: str, problem: str) -> None:
        self.source = source
        self.field = field
        self.problem = problem
        where = f"{source}: {field}" if field else source
        super().__init__(f"{where}: {problem}")


class InfraError(HaicoError):
    """The infrastructure, not the model, failed this item; it is retried on the next run."""


class RateLimitedError(InfraError):
    """The backend answered 429; retried like an infrastructure failure, reported apart."""


class StackError(HaicoError):
    """A service of the loopback stack failed to start, answer or stop."""


class GateError(HaicoError):
    """A preflight gate failed before the arm's first item."""
