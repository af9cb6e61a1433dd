"""An arm run's timeline, fed by the run's phases (`ArmRun`) and its conversations
(`ArmConversations`), and the summary's lines on it."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_haico.files import start_write_error
from pytest_haico.ledger.rundir import RunClaim
from pytest_haico.ledger.timeline import Timeline, job_section, shares_line
from pytest_haico.runner.adaptive import summary_line as adaptive_line
from pytest_haico.runner.model_metrics import summary_line
from pytest_haico.slurm.jobs import job_queue_times

if TYPE_CHECKING:
    from pytest_haico.ledger.records import LedgerRecord
    from pytest_haico.runner.arm_request import ArmRunRequest
    from pytest_haico.runner.stack_life import RunStack


class RunTimeline:
    """`runs/<run_id>/timeline.json` of one arm run. `concurrency` is what the run keeps in
    flight (`ConcurrencyController.record`), noted again at each conversation's end."""

    def __init__(
        self, request: ArmRunRequest, claim: RunClaim, *, concurrency: dict[str, Any]
    ) -> None:
        self._concurrency = concurrency
        self.summary: dict[str, Any] | None = None
        self.timeline = Timeline(
            claim.path,
            run_id=claim.run_id,
            campaign=getattr(request.recorder, "campaign", ""),
            arm=request.arm.name,
            session=f"{socket.gethostname()}:{os.getpid()}",
            job=job_section(os.environ),
            file_mode=request.recorder.file_mode,
        )
        self.timeline.note("concurrency", concurrency)
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

    def conversation(self, record: LedgerRecord | None, *, concurrency: dict[str, Any]) -> None:
        """A conversation ended with `record` (None: it was never recorded)."""
        if record is None:
            return
        start = datetime.fromisoformat(record.started_at).timestamp()
        end = datetime.fromisoformat(record.finished_at).timestamp()
        self._note_concurrency(concurrency)
        self.timeline.conversation(start=start, end=end)

    def drain(self, cause: str, *, signal: str | None = None) -> None:
        """The run began draining: noted in memory only (this may run in a signal handler,
        which must not write files); the next phase change writes it."""
        self.timeline.drain(cause, signal=signal, write=False)

    def draining(self, breaker_tripped: bool) -> None:
        """The run is stopping: a drain not caused yet is the breaker's or the stop's."""
        self.timeline.drain("breaker" if breaker_tripped else "stopped")

    @property
    def conversing(self) -> dict[str, Any]:
        """The conversing phase: the first conversation's start, the last one's end."""
        conversing: dict[str, Any] = self.timeline.doc["phases"].get("conversing", {})
        return conversing

    def conversations_ended(
        self, summary: dict[str, Any] | None, *, concurrency: dict[str, Any]
    ) -> None:
        """No conversation runs any more: what the run kept in flight in the end, and the
        sampler's summary of the model's utilisation (None: no sampler ran)."""
        self._note_concurrency(concurrency)
        if summary is None:
            return
        self.summary = summary
        self.timeline.model(summary)

    def _note_concurrency(self, concurrency: dict[str, Any]) -> None:
        self._concurrency = concurrency
        self.timeline.note("concurrency", concurrency)

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
        if self._concurrency["mode"] == "auto":
            lines.append(adaptive_line(self._concurrency))
        lines.append(f"timeline:    {shown(self.timeline.path)}")
        return lines
