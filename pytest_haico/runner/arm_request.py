"""What one arm's run is given, once, when its arm starts: a frozen request. Cheap to import:
`ArmRuns` builds it before the run's own imports (the stack, the driver, httpx)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from pytest_haico.config.concurrency import ConcurrencyPlan, resolve_concurrency
from pytest_haico.stack.request import BackendCommand, ModelEndpoint, StackRequest

if TYPE_CHECKING:
    from pytest_haico.config.bounds import Concurrency
    from pytest_haico.config.experiment import Arm
    from pytest_haico.config.settings import Settings
    from pytest_haico.driver.judging import Scorer
    from pytest_haico.ledger.layout import ArmPaths
    from pytest_haico.ledger.recorder import ItemAttempt
    from pytest_haico.ledger.records import ErrorInfo, LedgerRecord, TurnRecord
    from pytest_haico.ledger.rundir import RunClaim
    from pytest_haico.ledger.times import AttemptTimes
    from pytest_haico.ledger.verdicts import Verdict
    from pytest_haico.redact import Redactor
    from pytest_haico.runner.breaker import CircuitBreaker
    from pytest_haico.runner.preflight import GateLog
    from pytest_haico.runner.served import ServedCheck
    from pytest_haico.runner.walltime import WalltimeAdmission
    from pytest_haico.stack.kept import KeptState


class RunRecorder(Protocol):
    """What an arm's run needs of the campaign's `Recorder` (or of the observed one)."""

    @property
    def file_mode(self) -> int: ...

    def claim(self, arm: str) -> RunClaim: ...

    def paths(self, arm: str) -> ArmPaths: ...

    def use_redactor(self, arm: str, redactor: Redactor) -> None: ...

    def record(
        self,
        state: ItemAttempt,
        verdict: Verdict,
        *,
        turns: Iterable[TurnRecord] = (),
        error: ErrorInfo | None = None,
        times: AttemptTimes | None = None,
        in_flight_at_start: int = 0,
    ) -> LedgerRecord | None: ...


@dataclass(frozen=True, kw_only=True)
class ArmRunRequest:
    """Everything an `ArmRun` is given: its arm and stack, its options, the session's
    collaborators it reports to."""

    arm: Arm
    stack: StackRequest | KeptState  # the stack to build, or the kept one (--haico-attach)
    concurrency: Concurrency | None  # --haico-concurrency; None: the arm's run.concurrency
    dump_interval_s: float
    gates_only: bool = False  # stop short after the dynamic gates: no conversation runs
    recorder: RunRecorder
    # Per arm: each arm has its own stack, and a bad stack is what the breaker detects.
    breaker: CircuitBreaker
    admission: WalltimeAdmission  # the static gates, which passed, ran with it
    gate_log: GateLog
    provenance: Callable[[], Mapping[str, str]]  # what run-config records of the arm's start
    on_stop: Callable[[str], None]  # a breaker tripped, a service died: the session stops
    on_admission_stop: Callable[[str], None]  # the walltime refused the next conversation
    judge: Scorer | None = None  # scores the turns' `expect: {judge: ...}`

    @property
    def in_flight(self) -> ConcurrencyPlan:
        """How many conversations the arm keeps in flight: fixed, or auto within bounds."""
        return resolve_concurrency(self.concurrency, self.arm.run)


def stack_source(
    settings: Settings,
    arm: Arm,
    recorder: RunRecorder,
    *,
    kept: KeptState | None,
    served: ServedCheck | None = None,
) -> StackRequest | KeptState:
    """The stack the session's options ask for `arm`, writing into its run directory; or the
    kept one, with --haico-attach. A `served` model replaces the model server."""
    if kept is not None:
        return kept
    backend_command = None
    if settings.backend_cmd is not None:
        backend_command = BackendCommand(settings.backend_cmd, settings.backend_cmd_dir)
    model_endpoint = None
    if settings.model_endpoint is not None:
        model_endpoint = ModelEndpoint(settings.model_endpoint, settings.model_api_key or "")
    elif served is not None:
        model_endpoint = served.endpoint()
    return StackRequest(
        arm=arm,
        run_dir=recorder.claim(arm.name).path,
        profile=settings.profile,
        site=settings.site,
        backend_image=settings.backend_image,
        backend_command=backend_command,
        model_endpoint=model_endpoint,
        log_mode=recorder.file_mode,
    )
