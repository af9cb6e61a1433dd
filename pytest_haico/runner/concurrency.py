"""How many conversations an arm keeps in flight: a fixed number, or concurrency auto's target
moved at each sample of the model server's /metrics; the sampler, and its summary of the
model's utilisation."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import astuple
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_haico.ledger.model_metrics import FILE_NAME, Sample
from pytest_haico.runner.adaptive import AdaptiveConcurrency
from pytest_haico.runner.model_metrics import Sampler, summarise

if TYPE_CHECKING:
    from pytest_haico.config.concurrency import ConcurrencyPlan
    from pytest_haico.runner.stack_life import RunStack

_log = logging.getLogger(__name__)


class ConcurrencyController:
    """The arm's in-flight target: the plan's fixed number, or concurrency auto's, which the
    samples of `model-metrics.csv` adapt."""

    def __init__(self, plan: ConcurrencyPlan, *, run_dir: Path, file_mode: int) -> None:
        self.initial = plan.initial
        self._cap = plan.maximum
        self.adaptive: AdaptiveConcurrency | None = None
        if plan.adaptive:
            self.adaptive = AdaptiveConcurrency(initial=plan.initial, maximum=plan.maximum)
        self._path = run_dir / FILE_NAME
        self._mode = file_mode
        self._sampler: Sampler | None = None

    @property
    def record(self) -> dict[str, Any]:
        """What the run kept in flight: fixed, or auto with its adaptations."""
        if self.adaptive is None:
            return {"mode": "fixed", "limit": self._cap}
        return self.adaptive.record()

    def start_sampling(
        self,
        stack: RunStack,
        *,
        load: Callable[[], tuple[int, int]],
        resize: Callable[[int], None],
    ) -> None:
        """Sample the model server's /metrics from now on. `load()` is what is in flight and
        what is queued; auto's new target goes to `resize` at once, on the sampler's thread."""

        def backend_pid() -> int | None:
            process = stack.processes.get("backend")
            return process.pid if process is not None else None

        def adapt(sample: Sample) -> None:
            adaptation = self.adaptive.observe(sample) if self.adaptive is not None else None
            if adaptation is not None:
                resize(adaptation.new)
                _log.info("haico: concurrency %d → %d: %s", *astuple(adaptation)[1:])

        self._sampler = Sampler(
            f"{stack.llm_url}/metrics",
            self._path,
            state=load,
            backend_pid=backend_pid,
            on_sample=adapt,
            file_mode=self._mode,
        )
        try:
            self._sampler.start()
        except OSError as exc:
            _log.warning("haico: the model-metrics sampler did not start: %s", exc)
            self._sampler = None

    def stop_sampling(self, conversing: Mapping[str, Any]) -> dict[str, Any] | None:
        """Stop the sampler; its summary over the timeline's `conversing` phase, or None
        when no sampler ran."""
        sampler, self._sampler = self._sampler, None
        if sampler is None:
            return None
        sampler.stop()
        # The samples' clock (seconds from the sampler's start) for the conversing window
        # and the end of auto's ramp, both wall clock.
        first, last = conversing.get("first_start"), conversing.get("last_end")
        window = None
        if first is not None and last is not None:
            window = (first - sampler.started_at, last - sampler.started_at)
        ramp_end = self.adaptive.ramp_end() if self.adaptive is not None else None
        return summarise(
            sampler.samples,
            cap=self._cap,
            window=window,
            ramp_end=None if ramp_end is None else ramp_end - sampler.started_at,
        )
