"""An arm run's timeline and its model-metrics sampler, fed by the run's phases (`ArmRun`)."""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable
from dataclasses import astuple
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_haico.files import start_write_error
from pytest_haico.ledger.model_metrics import FILE_NAME, Sample
from pytest_haico.ledger.rundir import RunClaim
from pytest_haico.ledger.timeline import Timeline, job_section, shares_line
from pytest_haico.runner.adaptive import AdaptiveConcurrency
from pytest_haico.runner.adaptive import summary_line as adaptive_line
from pytest_haico.runner.model_metrics import Sampler, summarise, summary_line
from pytest_haico.slurm.jobs import job_queue_times

if TYPE_CHECKING:
    from pytest_haico.ledger.records import LedgerRecord
    from pytest_haico.runner.arm_conversations import ArmConversations
    from pytest_haico.runner.arm_request import ArmRunRequest
    from pytest_haico.runner.stack_life import RunStack

_log = logging.getLogger(__name__)


class RunTimeline:
    """`runs/<run_id>/timeline.json` and `model-metrics.csv` of one arm run."""

    def __init__(
        self, request: ArmRunRequest, claim: RunClaim, conversations: ArmConversations
    ) -> None:
        plan = request.in_flight
        self._cap = plan.maximum
        self._conversations = conversations
        # Concurrency auto: the target the samples adapt (None: a fixed number in flight).
        self.adaptive: AdaptiveConcurrency | None = None
        if plan.adaptive:
            self.adaptive = AdaptiveConcurrency(initial=plan.initial, maximum=plan.maximum)
        self._run_dir: Path = claim.path
        self._mode = request.recorder.file_mode
        self._sampler: Sampler | None = None
        self.summary: dict[str, Any] | None = None
        self.timeline = Timeline(
            claim.path,
            run_id=claim.run_id,
            campaign=getattr(request.recorder, "campaign", ""),
            arm=request.arm.name,
            session=f"{socket.gethostname()}:{os.getpid()}",
            job=job_section(os.environ),
            file_mode=self._mode,
        )
        self.timeline.note("concurrency", self.concurrency)
        static = request.gate_log.static_span  # they ran before the timeline existed
        if static is not None:
            self.timeline.span("static_gates", start=static[0], end=static[1])
        job = self.timeline.doc["job"]
        if job is not None:
            # The controller's answer may be slow: asked aside, written with the next change.
            threading.Thread(
                target=self._note_queue_times, args=(job,), name="haico-queue-times", daemon=True
            ).start()

    @staticmethod
    def _note_queue_times(job: dict[str, Any]) -> None:
        """When the job was queued, and started where Slurm's environment did not say
        (SLURM_JOB_START_TIME came with Slurm 23.02), as Slurm's controller shows them."""
        queued_at, started_at = job_queue_times(job["id"])
        # Both keys exist: the document keeps its size while another thread writes it.
        if queued_at is not None:
            job["queued_at"] = queued_at
        if job["started_at"] is None and started_at is not None:
            job["started_at"] = started_at

    def check_written(self) -> None:
        """Before the stack starts: a timeline.json that could not be written (a full disk)
        ends the start with the one line of a start-up write (exit 78)."""
        failure = self.timeline.write_failure
        if failure is not None:
            raise start_write_error(
                "write the run's timeline", self.timeline.path, failure, owner="run directory"
            )

    def start(self, phase: str) -> None:
        self.timeline.start(phase)

    def end(self, phase: str) -> None:
        if phase in self.timeline.doc["phases"] or phase != "drain":
            self.timeline.end(phase)

    def stack_started(self, stack: RunStack) -> None:
        """The stack is healthy: each service's launch and health, from its timings."""
        began = self.timeline.doc["phases"]["stack"]["start"]
        for name, timing in stack.timings.items():
            self.timeline.service(
                name, started=began + timing.launched, healthy=began + timing.ready
            )
        self.timeline.end("stack")

    def sample(self, stack: RunStack) -> None:
        """Start sampling the model server's /metrics (the conversations are about to run)."""
        conversations = self._conversations

        def backend_pid() -> int | None:
            process = stack.processes.get("backend")
            return process.pid if process is not None else None

        self._sampler = Sampler(
            f"{stack.llm_url}/metrics",
            self._run_dir / FILE_NAME,
            state=lambda: (conversations.in_flight, conversations.queued),
            backend_pid=backend_pid,
            on_sample=self._adapt,
            file_mode=self._mode,
        )
        try:
            self._sampler.start()
        except OSError as exc:
            _log.warning("haico: the model-metrics sampler did not start: %s", exc)
            self._sampler = None

    def _adapt(self, sample: Sample) -> None:
        """Concurrency auto, on the sampler's thread: a new target applies at once; the
        timeline gets it at its next write (on the main thread, which owns the file)."""
        if self.adaptive is None:
            return
        adaptation = self.adaptive.observe(sample)
        if adaptation is not None:
            self._conversations.resize(adaptation.new)
            _log.info("haico: concurrency %d → %d: %s", *astuple(adaptation)[1:])

    @property
    def concurrency(self) -> dict[str, Any]:
        """What the run kept in flight: fixed, or auto with its adaptations."""
        if self.adaptive is None:
            return {"mode": "fixed", "limit": self._cap}
        return self.adaptive.record()

    def conversation(self, record: LedgerRecord | None) -> None:
        if record is None:
            return
        start = datetime.fromisoformat(record.started_at).timestamp()
        end = datetime.fromisoformat(record.finished_at).timestamp()
        self.timeline.note("concurrency", self.concurrency)
        self.timeline.conversation(start=start, end=end)

    def drain(self, cause: str, *, signal: str | None = None) -> None:
        """The run began draining: noted in memory only (this may run in a signal handler,
        which must not write files); the next phase change writes it."""
        self.timeline.drain(cause, signal=signal, write=False)

    def draining(self, breaker_tripped: bool) -> None:
        """The run is stopping: a drain not caused yet is the breaker's or the stop's."""
        self.timeline.drain("breaker" if breaker_tripped else "stopped")

    def stop_sampling(self) -> None:
        sampler, self._sampler = self._sampler, None
        if sampler is None:
            return
        sampler.stop()
        self.timeline.note("concurrency", self.concurrency)
        # The samples' clock (seconds from the sampler's start) for the conversing window
        # and the end of auto's ramp, both wall clock.
        conversing = self.timeline.doc["phases"].get("conversing", {})
        first, last = conversing.get("first_start"), conversing.get("last_end")
        window = None
        if first is not None and last is not None:
            window = (first - sampler.started_at, last - sampler.started_at)
        ramp_end = self.adaptive.ramp_end() if self.adaptive is not None else None
        self.summary = summarise(
            sampler.samples,
            cap=self._cap,
            window=window,
            ramp_end=None if ramp_end is None else ramp_end - sampler.started_at,
        )
        self.timeline.model(self.summary)

    @property
    def model_line(self) -> str | None:
        """The summary's line on the model's utilisation (and bottleneck), or None."""
        return summary_line(self.summary) if self.summary is not None else None

    def exit(self, code: int) -> None:
        self.timeline.exit(code)

    def lines(self, shown: Callable[[Path], str] = str) -> list[str]:
        """The summary's lines: where the allocation went, the model's utilisation, and the
        timeline's path (as `shown` writes it)."""
        lines = [shares_line(self.timeline.doc)]
        if self.model_line is not None:
            lines.append(self.model_line)
        if self.adaptive is not None:
            lines.append(adaptive_line(self.adaptive.record()))
        lines.append(f"timeline:    {shown(self.timeline.path)}")
        return lines
