"""An arm's conversations in flight: the event-loop runner and the controller of how many it
keeps in flight, walltime admission, each item's conversation and its record, the circuit
breaker, the ways to stop them early, and what a dead service does to them."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from pytest_haico.driver.conversation import ConversationProgress
from pytest_haico.driver.result import ConversationResult
from pytest_haico.errors import LedgerWriteError, StackError
from pytest_haico.ledger.recorder import ItemAttempt
from pytest_haico.ledger.records import ErrorInfo
from pytest_haico.ledger.times import AttemptTimes
from pytest_haico.ledger.verdicts import Verdict, resolve_verdict
from pytest_haico.redact import Redactor
from pytest_haico.runner.arm_request import ArmRunRequest
from pytest_haico.runner.channel import Channel
from pytest_haico.runner.concurrency import ConcurrencyController
from pytest_haico.runner.finished import Conversation
from pytest_haico.runner.loop import Runner
from pytest_haico.runner.watch import ServiceDeath, ServiceWatch, WatchedProcess

if TYPE_CHECKING:
    from pytest_haico.runner.run_timeline import RunTimeline
    from pytest_haico.runner.stack_life import RunStack

_log = logging.getLogger(__name__)
T = TypeVar("T")
# How long a model server whose /health fails after a model error may take to exit.
MODEL_EXIT_GRACE_S = 5.0


class ArmConversations:
    """Keeps the arm's conversations in flight on a `Runner` and records each as it ends.

    `start` and `stop` run on pytest's main thread; `submit`, `wait` and the ways to stop
    early from any thread (those that say so from a signal handler). Each conversation's
    end and each early stop go into the run's `timeline`.
    """

    def __init__(
        self,
        request: ArmRunRequest,
        *,
        controller: ConcurrencyController,
        timeline: RunTimeline,
    ) -> None:
        self._request = request
        self._controller = controller
        self._timeline = timeline
        self._arm = request.arm.name
        self._claim = request.recorder.claim(self._arm)
        self._paths = request.recorder.paths(self._arm)
        self._runner: Runner[ItemAttempt, ConversationResult, Conversation] | None = None
        self._channel: Channel | None = None
        self._watch: ServiceWatch | None = None
        self._submitted: set[ItemAttempt] = set()
        self._redactor = Redactor()
        self._own_model_server = False
        self._log_tail: Callable[[str], str] = lambda service: ""

    @property
    def in_flight(self) -> int:
        return self._runner.in_flight if self._runner is not None else 0

    @property
    def queued(self) -> int:
        return self._runner.queued if self._runner is not None else 0

    @property
    def concurrency(self) -> dict[str, Any]:
        """What the arm kept in flight: fixed, or auto with its adaptations."""
        return self._controller.record

    @property
    def death(self) -> ServiceDeath | None:
        """The service the watch found dead, if any."""
        return self._watch.death if self._watch is not None else None

    @property
    def stack_failed(self) -> bool:
        """Whether the breaker tripped or a service died: what was in flight then was
        cancelled, so every conversation that started ends at once."""
        return self._request.breaker.tripped or self.death is not None

    def start(
        self,
        channel: Channel,
        *,
        redactor: Redactor,
        own_model_server: bool,
        log_tail: Callable[[str], str],
    ) -> None:
        """Start the runner's loop; nothing is admitted before `submit`. `own_model_server`:
        the model server is the run's child, which a model error may have killed;
        `log_tail(service)` is quoted when the breaker trips."""
        self._channel = channel
        self._redactor = redactor
        self._own_model_server = own_model_server
        self._log_tail = log_tail
        runner: Runner[ItemAttempt, ConversationResult, Conversation] = Runner(
            concurrency=self._controller.initial,
            finish=self._finish,
            admit=self._admit,
            name=f"haico-{self._arm}",
        )
        self._runner = runner
        runner.start()

    def call(self, factory: Callable[[], Awaitable[T]]) -> T:
        """Run one coroutine on the runner's loop (the start's steps); `cancel_calls` ends it."""
        return self._require_runner().call(factory)

    def cancel_calls(self) -> None:
        """End the `call` under way at once. Safe from a signal handler."""
        if self._runner is not None:
            self._runner.cancel_calls()

    def watch(self, processes: Callable[[], Mapping[str, WatchedProcess]]) -> None:
        """Watch the services while conversations are in flight: a death stops the arm."""
        runner = self._require_runner()
        self._watch = ServiceWatch(
            processes,
            busy=lambda: runner.in_flight > 0,
            on_death=self._on_death,
            name=f"haico-{self._arm}-watch",
        )
        self._watch.start()

    def sample(self, stack: RunStack) -> None:
        """Sample the model server's /metrics, to which concurrency auto adapts the number
        in flight (the conversations are about to run)."""
        runner = self._require_runner()
        self._controller.start_sampling(
            stack, load=lambda: (runner.in_flight, runner.queued), resize=runner.resize
        )

    def submit(self, state: ItemAttempt) -> None:
        """Queue the item's conversation; it starts as soon as a slot is free."""
        runner = self._require_runner()
        self._submitted.add(state)
        runner.submit(state, lambda: self._converse(state))

    def wait(self, state: ItemAttempt) -> Conversation:
        """Block until the item's conversation ended and its record is on disk (and in the
        timeline).

        An item the plan did not queue (its marks said pytest would skip it) is queued now.
        """
        if state not in self._submitted:
            self.submit(state)
        conversation = self._require_runner().wait(state)
        self._timeline.conversation(conversation.record, concurrency=self.concurrency)
        return conversation

    def was_admitted(self, state: ItemAttempt) -> bool:
        """Whether the item's conversation was started (it may have ended since)."""
        return self._runner is not None and self._runner.was_admitted(state)

    def ends_at_once(self, state: ItemAttempt) -> bool:
        """Whether the item's conversation started before the breaker tripped or a service
        died: cancelled then (or ended before), its record is made at once."""
        return self.stack_failed and self.was_admitted(state)

    # -- ending early, for the whole session (`ArmRuns`): safe from a signal handler -----

    def stop_admitting(self, reason: str) -> None:
        """The walltime: start no more conversations; those in flight go on."""
        self._timeline.drain("walltime")
        if self._runner is not None:
            self._runner.stop_admitting(reason)

    def cancel_after(self, delay: float, reason: str) -> None:
        """SIGUSR1: start no more conversations; cancel those still in flight `delay`
        seconds from now (recorded interrupted)."""
        self._timeline.drain("signal", signal="SIGUSR1")
        if self._runner is not None:
            self._runner.cancel_after(delay, reason)

    def cancel_in_flight(self, reason: str) -> None:
        """SIGINT, SIGTERM, a drain ended early: end the conversations in flight now
        (recorded interrupted)."""
        self._timeline.drain("stopped")
        if self._runner is not None:
            self._runner.cancel_in_flight(reason)

    def stop(self) -> None:
        """Stop watching; cancel what is in flight (recorded interrupted), close the channel
        and the loop. Problems are logged: the stack must still stop."""
        if self._watch is not None:
            self._watch.stop()
        runner = self._runner
        if runner is None:
            return
        try:
            runner.drain(0, reason="the run is stopping")
            runner.call(self._close, timeout=10)
        except Exception:  # the stack must still stop
            _log.exception("haico: stopping the conversations of arm %s", self._arm)
        finally:
            runner.close()

    def stop_sampling(self) -> None:
        """Stop sampling the model server; the timeline gets the sampler's summary."""
        summary = self._controller.stop_sampling(self._timeline.conversing)
        self._timeline.conversations_ended(summary, concurrency=self.concurrency)

    # -- on the runner's loop -----------------------------------------------------------

    def _admit(self, state: ItemAttempt) -> str | None:
        """Walltime admission: no new conversation that the job's remaining time cannot
        cover; the run then lets the in-flight ones finish and stops (exit 75)."""
        reason = self._request.admission.refusal(state.spec.stratum)
        if reason is not None:
            self._request.on_admission_stop(reason)
        return reason

    async def _close(self) -> None:
        if self._channel is not None:
            await self._channel.close()

    async def _converse(self, state: ItemAttempt) -> ConversationResult:
        channel = self._channel
        assert channel is not None
        progress = ConversationProgress()
        try:
            result = await channel.converse(state, progress)
        except asyncio.CancelledError:
            return self._with_death(progress.interrupted_result())
        if result.verdict is Verdict.INFRA_ERROR and self._watch is not None:
            # A dead service explains the failure better than the symptom the driver saw.
            death = self._watch.check()
            if death is None and result.error is not None and result.error.kind == "backend_model":
                death = await self._model_server_death(channel, self._watch)
            if death is not None:
                return self._with_death(result)
        self._observe(result)
        return result

    async def _model_server_death(
        self, channel: Channel, watch: ServiceWatch
    ) -> ServiceDeath | None:
        """After a model error: is the model server gone? A vLLM whose engine died answers
        one 5xx, then exits (with status 0) a moment later; so unless its /health answers,
        give its process a few seconds to end."""
        if not self._own_model_server or await channel.model_server_answers():
            return None
        deadline = time.monotonic() + MODEL_EXIT_GRACE_S
        try:
            while time.monotonic() < deadline:
                death = watch.check()
                if death is not None:
                    return death
                await asyncio.sleep(0.1)
        except asyncio.CancelledError:
            # The watch found the death first and cancelled what was in flight: that death
            # is this conversation's answer.
            if watch.death is None:
                raise
            return watch.death
        return None

    def _with_death(self, result: ConversationResult) -> ConversationResult:
        """The result of a conversation a dead service ended: infra_error, naming it."""
        death = self.death
        if death is None:
            return result
        verdict = resolve_verdict([result.verdict, Verdict.INFRA_ERROR])
        if verdict is not Verdict.INFRA_ERROR:
            return result  # a substitution found earlier still outranks it
        message = self._redactor.redact(death.describe())
        error = ErrorInfo(kind="service_died", message=message)
        return dataclasses.replace(result, verdict=verdict, error=error)

    def _on_death(self, death: ServiceDeath) -> None:
        """Stop at once: nothing more is admitted, what is in flight ends as infra_error."""
        reason = self._redactor.redact(death.describe())
        self._require_runner().cancel_in_flight(reason)
        self._request.on_stop(reason)

    def _observe(self, result: ConversationResult) -> None:
        """Feed the breaker while the conversation still holds its slot, so that no
        conversation is admitted between the failure that trips it and the stop."""
        if result.error is not None and result.error.kind == "transcript":
            # Results that cannot be kept are not worth running: stop as on a full ledger
            # (exit 75), with the file system's one line rather than a breaker's.
            self._require_runner().stop_admitting(result.error.message)
            self._request.on_stop(result.error.message)
            return
        breaker = self._request.breaker
        infra = result.verdict in (Verdict.INFRA_ERROR, Verdict.RATE_LIMITED)
        service = _failing_service(result.error) if infra else None
        was_tripped = breaker.tripped
        if breaker.observe(infra, service=service) and not was_tripped:
            reason = f"circuit breaker: {breaker.reason()}"
            # The stack is bad: what is in flight is recorded now (interrupted), not waited for.
            self._require_runner().cancel_in_flight(reason)
            culprit = service or "backend"
            tail = self._log_tail(culprit)
            self._request.on_stop(f"{reason}; the tail of the {culprit} log:\n{tail}")

    # -- on the runner's finish threads -------------------------------------------------

    def _finish(
        self, state: ItemAttempt, outcome: ConversationResult | BaseException, in_flight: int
    ) -> Conversation:
        result = outcome if isinstance(outcome, ConversationResult) else self._failed(outcome)
        try:
            # The conversation's own times, not the attempt's pytest start: the conversation
            # may have run ahead of pytest reaching its item (a negative duration, once).
            record = self._request.recorder.record(
                state,
                result.verdict,
                turns=result.turns,
                error=result.error,
                times=result.times,
                in_flight_at_start=in_flight,
            )
        except LedgerWriteError as exc:
            # Results that cannot be kept are not worth running: stop as a tripped breaker
            # does (exit 75), blaming the file system. The item's wait() raises it.
            self._require_runner().stop_admitting(str(exc))
            self._request.on_stop(str(exc))
            raise
        self._request.admission.observe(state.spec.stratum, result.verdict, result.duration_s)
        transcript = self._paths.transcript(state.spec.item_id, self._claim.run_id, state.attempt)
        return Conversation(spec=state.spec, result=result, record=record, transcript=transcript)

    def _failed(self, exc: BaseException) -> ConversationResult:
        kind = "interrupted" if isinstance(exc, asyncio.CancelledError) else "harness"
        verdict = Verdict.INTERRUPTED if kind == "interrupted" else Verdict.INFRA_ERROR
        message = self._redactor.redact(f"{type(exc).__name__}: {exc}")
        return ConversationResult(
            verdict=verdict,
            turns=(),
            error=ErrorInfo(kind=kind, message=message),
            times=AttemptTimes.instant(),
        )

    def _require_runner(self) -> Runner[ItemAttempt, ConversationResult, Conversation]:
        if self._runner is None:
            raise StackError(f"the conversations of arm {self._arm} are not running")
        return self._runner


def _failing_service(error: ErrorInfo | None) -> str:
    """Which service an infra failure points at, for the breaker's message."""
    kind = error.kind if error is not None else ""
    if kind in ("backend_model", "backend_auth"):
        return "llm"
    if kind == "snapshot":
        return "postgres"
    return "backend"
