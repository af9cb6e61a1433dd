"""The exceptions pytest-haico raises, under one base.

HaicoError
├── ConfigError          a malformed arm, script, option or cluster.env (→ pytest.UsageError)
├── InfraError           the stack failed an item (backend or model server down, 5xx, timeout,
│   │                    broken stream, auth refused); a test body may raise it too
│   ├── RateLimitedError the backend answered 429
│   ├── JudgeError       the judge model cannot answer (unresolvable, unreachable, unparseable)
│   └── WireError        the backend sent something that is not an event of the wire format
├── StackError           a service failed to start, answer or stop
│   ├── PortInUseError   a co-tenant took a service's port after it was claimed
│   └── GateFailedError  a preflight gate failed before the arm's first item (exit 78);
│                        beside the gate results it holds, in `gates.result`
├── LedgerWriteError     a ledger record could not be made durable (full or read-only disk)
├── DumpError            pg_dump of the backend's database failed
├── UntrustedFileError   a file another user could have planted: a symlink, not a regular
│                        file, not this user's, or writable by others
├── ResultsError         the results directory cannot be used (unreadable ledger, read-only or
│   │                    full file system); raised before anything starts
│   └── ShareClaimedError another live run holds this arm × shard × stratum
├── CatalogueError       a served model cannot be resolved: no such name, its job no longer
│                        runs, or its entry or key cannot be trusted
└── NotAdmittedError     a conversation was never started: the runner had stopped admitting
"""

from __future__ import annotations

from pathlib import Path


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


class JudgeError(InfraError):
    """The judge of a turn's `expect: {judge: ...}` could not answer: its served model cannot
    be resolved or reached, or it did not answer yes or no after its retries."""


class StackError(HaicoError):
    """A service of the loopback stack failed to start, answer or stop. `brief` is what the
    item's error, pytest's stop line and the progress line say of a long message, which
    the haico summary then prints once, whole."""

    def __init__(self, message: str, *, brief: str | None = None) -> None:
        super().__init__(message)
        self._brief = brief

    @property
    def brief(self) -> str:
        return self._brief or str(self)


class WireError(InfraError):
    """The backend sent something that is not an event of this wire format."""


class PortInUseError(StackError):
    """The service could not bind its port: a co-tenant took it after it was claimed."""


class LedgerWriteError(HaicoError):
    """A record could not be appended and fsynced; the run stops rather than lose it."""


class ShareTakenOverError(LedgerWriteError):
    """Another run took this run's share (its job requeued, or ended and continued, while
    this run lived on, cut off from Slurm): this run records nothing more, so no item is
    recorded twice."""


class NotAdmittedError(HaicoError):
    """A submitted conversation was never started: the runner had stopped admitting."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


class DumpError(HaicoError):
    """pg_dump of the backend's database failed; the message is redacted."""


class UntrustedFileError(HaicoError):
    """A file read back from a shared place is not a regular file of this user's that only
    it may write; `path` names it, `problem` says what is wrong ("is a symbolic link")."""

    def __init__(self, path: Path, problem: str) -> None:
        self.path = path
        self.problem = problem
        super().__init__(f"{path} {problem}")


class ResultsError(HaicoError):
    """The results directory cannot be used as the run needs: an unreadable ledger, a read-only
    or full file system, a share another live run holds. Raised before anything starts."""


class ShareClaimedError(ResultsError):
    """Another live run holds the share this run was about to run; `holder` describes it."""

    def __init__(self, message: str, *, holder: object, path: Path) -> None:
        self.holder = holder
        self.path = path
        super().__init__(message)


class CatalogueError(HaicoError):
    """A served model's catalogue entry cannot be used: the name is unknown, its job no longer
    runs (a stale entry), or the entry, its key file or the catalogue cannot be trusted."""


def headline(message: str) -> str:
    """A message's first line without the log tail it announces (`...; last lines of
    <log>:`): what a one-line report of it shows."""
    first = message.splitlines()[0] if message else message
    if first.endswith(":") and "; " in first:
        first = first.rsplit("; ", 1)[0]
    return first
