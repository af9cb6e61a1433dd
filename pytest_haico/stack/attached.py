"""A kept stack as a run sees it (`--haico-attach`): the same URLs, ports, logs and secrets as
a stack the run started, whose `start` only checks it is still there and whose `stop` leaves
it running. Its services are not this run's children: a death shows as a process that ended
(the supervisor, their parent, knows how)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from pytest_haico.errors import StackError
from pytest_haico.stack.kept import KeptService, KeptState
from pytest_haico.stack.orchestrator import ServiceTiming
from pytest_haico.stack.service_log import read_log_tail


class KeptProcess:
    """A service process of the kept stack, watched through /proc."""

    def __init__(self, service: KeptService, secrets: tuple[str, ...]) -> None:
        self.service = service
        self.pid: int | None = service.pid
        self.log_path = Path(service.log_path)
        self._secrets = secrets

    def exit_status(self) -> int | None:
        """None while it runs, then `ENDED` (its status is its parent's, the supervisor's,
        to know)."""
        return None if self.service.alive() else ENDED

    def log_tail(self) -> str:
        return read_log_tail(self.log_path, secrets=self._secrets)


# The exit status a watch reports for a kept service that ended (not a child: unknown).
ENDED = -256


class AttachedStack:
    """What an attached run uses of a kept stack."""

    llm = None  # no model-server process of this run's to wait for after a model error

    def __init__(self, state: KeptState) -> None:
        self.state = state
        self.backend_url = state.backend_url
        self.llm_url = state.llm_url
        self.model_endpoint = state.model_endpoint
        self.api_key = state.api_key
        self.admin_token = state.admin_token
        self.readonly_dsn = state.readonly_dsn
        self.secrets = state.secrets
        self.postgres_version = state.postgres_version
        self.backend_config: Mapping[str, str] = {}
        self.processes: Mapping[str, KeptProcess] = {
            service.name: KeptProcess(service, state.secrets) for service in state.services
        }

    @property
    def ports(self) -> Mapping[str, int]:
        return {service.name: service.port for service in self.state.services}

    @property
    def log_paths(self) -> Mapping[str, Path]:
        return {service.name: Path(service.log_path) for service in self.state.services}

    @property
    def timings(self) -> Mapping[str, ServiceTiming]:
        """The kept stack's own start-up (this run started nothing)."""
        return {
            service.name: ServiceTiming(
                prepare=0.0, healthy=service.ready_s, attempts=1, ready=service.ready_s
            )
            for service in self.state.services
        }

    def start(self) -> AttachedStack:
        """Check the supervisor and every service are still there."""
        state = self.state
        gone = [s.name for s in state.services if not s.alive()]
        if not state.supervisor_alive() or gone:
            what = f"{', '.join(gone)} ended" if gone else "its supervisor ended"
            raise StackError(
                f"the kept stack of arm {state.arm} is gone ({what}; its logs: "
                f"{state.directory}): start one with `haico stack up {state.arm}`"
            )
        return self

    def stop(self) -> None:
        """Nothing: the kept stack runs on until `haico stack down`."""

    def interrupt(self, reason: str) -> None:
        """Nothing to interrupt: attaching starts no service."""
