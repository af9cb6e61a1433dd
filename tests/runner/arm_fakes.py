"""An `ArmRun` over fakes: a stack that starts and stops in no time, a channel without a
backend, dumps without pg_dump, a recorder without a ledger. No process, no socket."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from pytest_haico.config.experiment import Arm, Script, ScriptSource
from pytest_haico.config.items import ItemSpec
from pytest_haico.driver.conversation import ConversationProgress
from pytest_haico.driver.result import ConversationResult
from pytest_haico.errors import StackError
from pytest_haico.gates.result import GateResult, passed
from pytest_haico.ledger.layout import ArmPaths
from pytest_haico.ledger.recorder import ItemAttempt
from pytest_haico.ledger.records import ErrorInfo, LedgerRecord, TurnRecord
from pytest_haico.ledger.rundir import RunClaim
from pytest_haico.ledger.times import AttemptTimes
from pytest_haico.ledger.verdicts import Verdict
from pytest_haico.redact import Redactor
from pytest_haico.runner.arm_request import ArmRunRequest
from pytest_haico.runner.arm_run import ArmRun
from pytest_haico.runner.breaker import CircuitBreaker
from pytest_haico.runner.finished import Conversation
from pytest_haico.runner.outside import Outside
from pytest_haico.runner.preflight import GateLog
from pytest_haico.runner.stack_life import RunStack
from pytest_haico.runner.walltime import WalltimeAdmission
from pytest_haico.stack.kept import KeptState
from pytest_haico.stack.orchestrator import ServiceTiming
from pytest_haico.stack.request import StackRequest

ARM = Arm(name="demo")
SERVICES = ("llm", "postgres", "backend")
TIMEOUT_S = 10.0  # only reached when a test fails


class FakeProcess:
    """A service process that runs until the test sets its exit `status`."""

    def __init__(self, name: str, log_path: Path, pid: int) -> None:
        self.pid: int | None = pid
        self.log_path = log_path
        self.status: int | None = None
        log_path.write_text(f"{name} started\n{name} said goodbye\n")

    def exit_status(self) -> int | None:
        return self.status

    def log_tail(self) -> str:
        return f"    {self.log_path.stem} said goodbye"


class FakeStack:
    """Three services that start and stop in no time; it counts both."""

    backend_url = "http://127.0.0.1:9/backend"
    llm_url = "http://127.0.0.1:9/llm"
    model_endpoint = "http://vllm.localhost:9/v1"
    api_key = "fake-api-key"
    admin_token = "fake-admin-token"
    readonly_dsn = "postgresql://haico_readonly:fake-password@127.0.0.1:9/haico"
    postgres_version = "16.4"
    llm: object | None = "the run's own model server"

    def __init__(self, log_dir: Path) -> None:
        log_dir.mkdir(parents=True, exist_ok=True)
        self.processes = {
            name: FakeProcess(name, log_dir / f"{name}.log", 4000 + i)
            for i, name in enumerate(SERVICES)
        }
        self.backend_config: Mapping[str, str] = {}
        self.start_error: StackError | None = None
        self.started = 0
        self.stopped = 0
        self.interrupted: list[str] = []

    @property
    def secrets(self) -> tuple[str, ...]:
        return (self.api_key, self.admin_token, "fake-password")

    @property
    def ports(self) -> Mapping[str, int]:
        return dict.fromkeys(SERVICES, 9)

    @property
    def log_paths(self) -> Mapping[str, Path]:
        return {name: process.log_path for name, process in self.processes.items()}

    @property
    def timings(self) -> Mapping[str, ServiceTiming]:
        return {name: ServiceTiming(prepare=0.0, healthy=0.1, attempts=1) for name in SERVICES}

    def start(self) -> FakeStack:
        """Like `Stack.start`, an interrupted or failed start has stopped what it started."""
        self.started += 1
        if self.interrupted:
            raise StackError(f"{self.interrupted[0]}: the stack was stopped while starting")
        if self.start_error is not None:
            raise self.start_error
        return self

    def stop(self) -> None:
        self.stopped += 1

    def interrupt(self, reason: str) -> None:
        self.interrupted.append(reason)


class FakeChannel:
    """The conversations' channel without a backend: each conversation ends at once with
    `verdict`, or with `hold` runs until it is cancelled."""

    def __init__(self) -> None:
        self.gates: tuple[GateResult, ...] = (passed("canary_turn", "answered"),)
        self.open_error: Exception | None = None
        self.block_open = False  # open waits until it is cancelled
        self.opening = threading.Event()
        self.open_cancelled = False
        self.hold = False
        self.verdict = Verdict.COMPLETED
        self.error: ErrorInfo | None = None
        self.conversing = 0  # conversations under way now
        self.conversations = 0  # conversations begun
        self.close_error: Exception | None = None
        self.closed = False

    async def open(self) -> None:
        self.opening.set()
        if self.block_open:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.open_cancelled = True
                raise
        if self.open_error is not None:
            raise self.open_error

    async def dynamic_gates(self) -> tuple[GateResult, ...]:
        return self.gates

    async def converse(
        self, state: ItemAttempt, progress: ConversationProgress
    ) -> ConversationResult:
        self.conversations += 1
        self.conversing += 1
        try:
            if self.hold:
                await asyncio.Event().wait()
        finally:
            self.conversing -= 1
        return ConversationResult(
            verdict=self.verdict,
            turns=(),
            error=self.error,
            times=AttemptTimes.instant(),
        )

    async def model_server_answers(self) -> bool:
        return True

    async def close(self) -> None:
        self.closed = True
        if self.close_error is not None:
            raise self.close_error


class FakeDumps:
    """Dumps that only note what was asked of them."""

    def __init__(self, dumps_dir: Path) -> None:
        self.dumps_dir = dumps_dir
        self.written: list[Path] = []
        self.calls: list[str] = []
        self.dump_error: Exception | None = None

    def start_periodic(self) -> None:
        self.calls.append("start_periodic")

    def stop_periodic(self) -> None:
        self.calls.append("stop_periodic")

    def abort(self) -> None:
        self.calls.append("abort")

    def dump(self, kind: str) -> Path:
        self.calls.append(f"dump {kind}")
        if self.dump_error is not None:
            raise self.dump_error
        path = self.dumps_dir / f"{kind}.dump"
        self.written.append(path)
        return path


@dataclass(frozen=True)
class Recorded:
    state: ItemAttempt
    verdict: Verdict
    error: ErrorInfo | None


class FakeRecorder:
    """The campaign's recorder without a ledger: it keeps what it is given."""

    file_mode = 0o640

    def __init__(self, root: Path) -> None:
        self.root = root
        self.records: list[Recorded] = []
        self.redactors: dict[str, Redactor] = {}
        self._lock = threading.Lock()

    def claim(self, arm: str) -> RunClaim:
        path = self.root / arm / "runs" / "local-test.0"
        path.mkdir(parents=True, exist_ok=True)
        return RunClaim(run_id="local-test.0", path=path)

    def paths(self, arm: str) -> ArmPaths:
        return ArmPaths(self.root / arm)

    def use_redactor(self, arm: str, redactor: Redactor) -> None:
        self.redactors[arm] = redactor

    def record(
        self,
        state: ItemAttempt,
        verdict: Verdict,
        *,
        turns: Iterable[TurnRecord] = (),
        error: ErrorInfo | None = None,
        times: AttemptTimes | None = None,
        in_flight_at_start: int = 0,
    ) -> LedgerRecord | None:
        with self._lock:
            self.records.append(Recorded(state, verdict, error))
            state.recorded = verdict
        return None


class ArmHarness:
    """An `ArmRun` over the fakes, and the fakes, for a test to set up and inspect."""

    def __init__(self, tmp_path: Path, *, gates_only: bool = False, concurrency: int = 2) -> None:
        self.stack = FakeStack(tmp_path / "logs")
        self.channel = FakeChannel()
        self.dumps = FakeDumps(tmp_path / "dumps")
        self.recorder = FakeRecorder(tmp_path / "results")
        self.stops: list[str] = []  # what the run told the session to stop for
        self.opened: list[str] = []  # what the run opened outside itself
        self.server_error: Exception | None = None  # the model server's account fails
        self.while_building: Callable[[], None] | None = None  # runs as the stack is built
        request = ArmRunRequest(
            arm=ARM,
            stack=StackRequest(arm=ARM, run_dir=tmp_path / "run"),
            concurrency=concurrency,
            dump_interval_s=0.0,
            gates_only=gates_only,
            recorder=self.recorder,
            breaker=CircuitBreaker(),
            admission=WalltimeAdmission(None, None, drain_margin_s=0.0),
            gate_log=GateLog(tmp_path / "gates.json", file_mode=0o640),
            provenance=lambda: {"ARM": ARM.name},
            on_stop=self.stops.append,
            on_admission_stop=self.stops.append,
        )
        self.run = ArmRun(
            request,
            outside=Outside(
                open_stack=self._open_stack,
                open_channel=self._open_channel,
                open_dumps=self._open_dumps,
                model_server_values=self._model_server_values,
                model_server_metrics=self._model_server_metrics,
            ),
        )
        self.run_dir = self.run.claim.path

    def _open_stack(self, source: StackRequest | KeptState) -> RunStack:
        self.opened.append("stack")
        if self.while_building is not None:
            self.while_building()
        return self.stack

    def _open_channel(
        self, stack: RunStack, request: ArmRunRequest, redactor: Redactor
    ) -> FakeChannel:
        self.opened.append("channel")
        return self.channel

    def _open_dumps(self, stack: RunStack, request: ArmRunRequest, run_dir: Path) -> FakeDumps:
        self.opened.append("dumps")
        return self.dumps

    def _model_server_values(self, url: str, key: str) -> tuple[dict[str, str], dict[str, object]]:
        if self.server_error is not None:
            raise self.server_error
        return {"VLLM_VERSION": "0.0-fake"}, {"models": ["demo"]}

    def _model_server_metrics(self, url: str) -> dict[str, float]:
        return {"vllm:num_requests_running": 0.0}


def attempt(n: int) -> ItemAttempt:
    """The first attempt of item `n` of the demo arm."""
    script = Script.model_validate({"id": f"script-{n}", "turns": [{"user": "Hello"}]})
    source = ScriptSource(script=script, path=Path(f"script-{n}.yaml"), position=0, sha256="0" * 64)
    spec = ItemSpec(
        ordinal=n,
        arm=ARM,
        source=source,
        repeat=0,
        item_id=f"{n:064x}",
        model_identity="model",
        backend_identity="backend",
    )
    return ItemAttempt(spec, f"test_conversations.py::test_conversation[{spec.test_id}]", 1)


def wait_for_conversation(run: ArmRun, state: ItemAttempt) -> Conversation:
    """`run.conversations.wait(state)`, bounded: a test that would hang fails instead."""
    pool = concurrent.futures.ThreadPoolExecutor(1)
    try:
        return pool.submit(run.conversations.wait, state).result(TIMEOUT_S)
    finally:
        pool.shutdown(wait=False)
