"""An arm run's provenance and dumps: run-config at the start (the model server's metrics at
the start and at the end), what changed since the arm's previous run, the periodic pg_dumps
while the run goes on and the final one before its stack stops."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from pytest_haico.errors import DumpError
from pytest_haico.files import start_write_error
from pytest_haico.provenance.dumps import DumpKind
from pytest_haico.provenance.model_server import startup_values
from pytest_haico.provenance.runconfig import RunConfig, previous_run
from pytest_haico.redact import Redactor
from pytest_haico.runner.arm_request import ArmRunRequest
from pytest_haico.runner.stack_life import RunStack
from pytest_haico.stack.attached import AttachedStack

_log = logging.getLogger(__name__)


class Dumps(Protocol):
    """A run's pg_dumps (`DatabaseDumps`)."""

    @property
    def dumps_dir(self) -> Path: ...
    @property
    def written(self) -> list[Path]: ...

    def start_periodic(self) -> None: ...
    def stop_periodic(self) -> None: ...
    def abort(self) -> None: ...
    def dump(self, kind: DumpKind) -> Path: ...


# The model server's own account for run-config: (values, details) from its base URL and key;
# and its metrics from its base URL.
ModelServerValues = Callable[[str, str], tuple[dict[str, str], dict[str, Any]]]
ModelServerMetrics = Callable[[str], dict[str, float]]


class ArmProvenance:
    """Writes the run's run-config and keeps its dumps; failures to dump are kept, not raised."""

    def __init__(
        self,
        request: ArmRunRequest,
        run_dir: Path,
        *,
        open_dumps: Callable[[RunStack, ArmRunRequest, Path], Dumps | None],
        model_server_values: ModelServerValues,
        model_server_metrics: ModelServerMetrics,
    ) -> None:
        self._request = request
        self._run_dir = run_dir
        self._open_dumps = open_dumps
        self._values = model_server_values
        self._metrics = model_server_metrics
        self._stack: RunStack | None = None
        self.run_config: RunConfig | None = None
        self.provenance_changes: list[str] = []  # since the arm's previous run
        self.dumps: Dumps | None = None
        self.dump_failure: str | None = None

    def start_dumps(self, stack: RunStack) -> None:
        """The periodic dumps of a stack this run started (a kept stack's supervisor runs
        its own)."""
        self.dumps = self._open_dumps(stack, self._request, self._run_dir)
        if self.dumps is not None:
            self.dumps.start_periodic()

    def record_start(self, stack: RunStack, *, redactor: Redactor) -> None:
        """run-config.env/.json: the knobs, the host, the versions, the ports, the model
        server's own account (and vLLM's start-up arguments from its log); and what changed
        since the arm's previous run."""
        self._stack = stack
        config = RunConfig(
            self._run_dir, redactor=redactor, file_mode=self._request.recorder.file_mode
        )
        ports = stack.ports
        config.update(self._request.provenance())
        config.update(
            {
                "POSTGRES_VERSION": stack.postgres_version,
                "POSTGRES_PORT": str(ports.get("postgres", "")),
                "VLLM_PORT": str(ports.get("llm", "")),
                "BACKEND_PORT": str(ports.get("backend", "")),
                **({"PHOENIX_PORT": str(ports["phoenix"])} if "phoenix" in ports else {}),
                "MODEL_ENDPOINT": stack.model_endpoint,  # as the backend is given it
                "MODEL_SERVER_URL": stack.llm_url,  # as haico reaches it (behind a relay)
            }
        )
        # The haico-owned configuration the backend was given (cluster profile; no secret).
        config.update({f"BACKEND_CONFIG_{key}": v for key, v in stack.backend_config.items()})
        if isinstance(stack, AttachedStack):  # where its services' logs and dumps are
            config.update({"KEPT_STACK": str(stack.state.directory)})
        values, details = self._values(stack.llm_url, stack.api_key)
        # What vLLM says it started with, from its log (a server started elsewhere: none).
        startup, startup_details = startup_values(stack.log_paths.get("llm"))
        config.update({**values, **startup})
        for key, value in {**details, **startup_details}.items():
            config.detail(key, value)
        config.detail("metrics_start", self._metrics(stack.llm_url))
        try:
            config.write()
        except OSError as exc:  # the run's provenance is not optional: its start fails
            what = "write run-config.env/.json in"
            raise start_write_error(what, self._run_dir, exc, owner="run directory") from exc
        self.run_config = config
        earlier = previous_run(self._run_dir.parent, self._run_dir)
        if earlier is not None:
            self.provenance_changes = [
                f"since run {earlier.name}: {change}" for change in config.changed_since(earlier)
            ]

    def detail(self, key: str, value: Any) -> None:
        """A structured value for run-config.json (the concurrency's adaptations), written now."""
        if self.run_config is None:
            return
        self.run_config.detail(key, value)
        try:
            self.run_config.write()
        except OSError as exc:
            _log.warning("haico: arm %s: run-config not updated: %s", self._request.arm.name, exc)

    def abort_dumps(self) -> None:
        """No more pg_dumps; the one running is killed. Safe from a signal handler."""
        if self.dumps is not None:
            self.dumps.abort()

    def finish(self, *, final_dump: bool, postgres_died: bool) -> None:
        """The model server's metrics at the end and the final dump, unless `final_dump` is
        off (SIGTERM: the newest periodic dump is what survives)."""
        if final_dump:
            self._record_end()
        dumps = self.dumps
        if dumps is None:
            return
        if not final_dump:
            dumps.abort()
            return
        dumps.stop_periodic()
        if postgres_died:
            self.dump_failure = "no final dump: postgres had died"
            return
        try:
            dumps.dump("final")
        except DumpError as exc:
            self.dump_failure = f"the final dump failed: {exc}"
            _log.warning("haico: arm %s: %s", self._request.arm.name, self.dump_failure)

    def _record_end(self) -> None:
        """The model server's metrics at the arm's end: requests still running were
        abandoned but are still generating."""
        if self.run_config is None or self._stack is None:
            return
        try:
            self.run_config.detail("metrics_end", self._metrics(self._stack.llm_url))
            self.run_config.write()
        except OSError as exc:
            _log.warning("haico: arm %s: run-config not updated: %s", self._request.arm.name, exc)
