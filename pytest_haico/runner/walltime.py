"""Walltime-aware admission: start a conversation only if the job's remaining time covers it.

A new conversation of a stratum is admitted while the Slurm job's remaining walltime
covers the stratum's measured p95 item time plus the drain margin. The job's end time
comes from Slurm (read at start, refreshed rarely: an admin may move it with
``scontrol update``); item times come from the arm's earlier ledgers and from the
conversations this run finishes. Whatever cannot be known admits: without a job id,
an end time or an item time of the stratum there is no limit, and the circuit breaker
and the drain protect the run instead.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from pytest_haico.durations import format_duration
from pytest_haico.ledger.item_times import ItemTimes
from pytest_haico.ledger.verdicts import Verdict
from pytest_haico.slurm import client as slurm
from pytest_haico.slurm.jobs import job_end_time

_log = logging.getLogger(__name__)

Warn = Callable[[str], None]
Clock = Callable[[], float]
Spawn = Callable[[Callable[[], None]], None]

DEFAULT_REFRESH_S = 300.0


def _spawn_thread(target: Callable[[], None]) -> None:
    threading.Thread(target=target, name="haico-walltime-refresh", daemon=True).start()


class JobEndTime:
    """The Slurm job's end time (epoch seconds), read from Slurm and cached.

    `refresh` reads it on the calling thread (`job_end_time`: squeue, else scontrol, each
    bounded by Slurm's timeout for queries from inside a run). `get` never blocks: it
    returns the cached value and, once the last read is ``refresh_s`` old, starts the next
    read through ``spawn`` (by default a daemon thread), so a slow slurmctld stalls no
    conversation on the event loop.

    An explicit "no end time" answer (an UNLIMITED job) clears the end time; a read that
    fails (no command, non-zero exit, timeout, unparsable output) keeps the last one
    known and is reported once through ``warn``. Thread-safe.
    """

    def __init__(
        self,
        job_id: str,
        *,
        refresh_s: float = DEFAULT_REFRESH_S,
        env: Mapping[str, str] | None = None,
        run: slurm.Run = slurm.run,
        clock: Clock = time.time,
        spawn: Spawn = _spawn_thread,
        warn: Warn | None = None,
    ) -> None:
        self.job_id = job_id
        self.refresh_s = refresh_s
        self._env = env
        self._run = run
        self._clock = clock
        self._spawn = spawn
        self._warn = warn
        self._lock = threading.Lock()
        self._end: float | None = None
        self._read_at: float | None = None  # when the newest read started
        self._reading = False
        self._warned = False

    @property
    def end(self) -> float | None:
        """The cached end time, without starting a read."""
        with self._lock:
            return self._end

    def get(self) -> float | None:
        """The cached end time; starts a background read when the last one is stale."""
        now = self._clock()
        with self._lock:
            last = self._read_at
            # A clock that went back (NTP) makes the cache stale too.
            stale = last is None or now - last >= self.refresh_s or now < last
            if not stale or self._reading:
                return self._end
            self._reading = True
            self._read_at = now
        try:
            self._spawn(self._refresh_in_background)
        except Exception:  # no thread at interpreter exit: keep the cached value
            _log.warning("walltime: cannot start a refresh of job %s's end time", self.job_id)
            with self._lock:
                self._reading = False
        return self.end  # the new value if the read already ended

    def refresh(self) -> float | None:
        """Read the end time now, on this thread, and return the value then cached."""
        with self._lock:
            self._read_at = self._clock()
        known, end, problem = self._read()
        with self._lock:
            if known:
                self._end = end
            cached = self._end
            warn = problem is not None and not self._warned
            self._warned = self._warned or warn
        if problem is not None:
            if warn and self._warn is not None:
                self._warn(problem)
            else:
                _log.info("walltime: %s", problem)
        return cached

    def _refresh_in_background(self) -> None:
        try:
            self.refresh()
        except Exception:
            _log.exception("walltime: refreshing job %s's end time failed", self.job_id)
        finally:
            with self._lock:
                self._reading = False

    def _read(self) -> tuple[bool, float | None, str | None]:
        """(whether Slurm answered, the end time or None for no limit, the problem)."""
        try:
            return True, job_end_time(self.job_id, environ=self._env, run=self._run), None
        except slurm.SlurmError as exc:
            return (
                False,
                None,
                f"{exc}; walltime admission keeps the last end time it read, and admits "
                "without a walltime limit until it has one. Check that squeue and scontrol "
                f"work on this node (squeue -j {self.job_id})",
            )


class WalltimeAdmission:
    """The runner's ``admit`` check: `refusal` says why a stratum's next item cannot start.

    Without a ``job_id`` (no ``SLURM_JOB_ID``) it admits everything and runs nothing.
    The constructor reads the ledgers and the job's end time on the calling thread;
    later reads of the end time happen in the background (see `JobEndTime`).
    ``drain_margin_s`` is what the run needs after its last admission ends:
    ``--haico-drain-timeout`` plus the final dump. Warnings (an unreadable end time or
    ledger) go to ``warn`` and to `warnings`, each once.
    """

    def __init__(
        self,
        job_id: str | None,
        ledger_dir: Path | None,
        *,
        drain_margin_s: float,
        refresh_s: float = DEFAULT_REFRESH_S,
        env: Mapping[str, str] | None = None,
        run: slurm.Run = slurm.run,
        clock: Clock = time.time,
        spawn: Spawn = _spawn_thread,
        warn: Warn | None = None,
    ) -> None:
        self.job_id = job_id or None  # an empty SLURM_JOB_ID is no job
        self.drain_margin_s = drain_margin_s
        self._clock = clock
        self._warn = warn
        self._warnings: list[str] = []
        self._warnings_lock = threading.Lock()
        self.item_times = (
            ItemTimes.from_ledger_dir(ledger_dir, warn=self._report)
            if ledger_dir is not None
            else ItemTimes()
        )
        self.end_time: JobEndTime | None = None
        if self.job_id is not None:
            self.end_time = JobEndTime(
                self.job_id,
                refresh_s=refresh_s,
                env=env,
                run=run,
                clock=clock,
                spawn=spawn,
                warn=self._report,
            )
            self.end_time.refresh()

    @property
    def warnings(self) -> tuple[str, ...]:
        with self._warnings_lock:
            return tuple(self._warnings)

    def observe(self, stratum: str, verdict: Verdict | str, duration_s: float) -> None:
        """Count a conversation of this run that ended (call it from ``finish``)."""
        self.item_times.observe(stratum, verdict, duration_s)

    def remaining_s(self) -> float | None:
        """Seconds until the job's end time, None when it has none known."""
        end = None if self.end_time is None else self.end_time.get()
        return None if end is None else end - self._clock()

    def refusal(self, stratum: str) -> str | None:
        """None to admit the stratum's next item, or why not; never raises."""
        try:
            return self._refusal(stratum)
        except Exception:
            # The runner stops the whole run when its admit check raises: a bug here
            # must not end a campaign that the breaker and the drain still protect.
            _log.exception("walltime admission failed for stratum %r; admitting", stratum)
            return None

    def _refusal(self, stratum: str) -> str | None:
        if self.end_time is None:
            return None
        item = self.item_times.get(stratum)
        if item is None:
            return None
        remaining = self.remaining_s()
        if remaining is None or remaining >= item.p95_s + self.drain_margin_s:
            return None
        ends = f"ends in {format_duration(remaining)}" if remaining > 0 else "is at its end time"
        return (
            f"job {self.job_id} {ends}; items of stratum {stratum} take "
            f"{format_duration(item.p95_s)} (p95 of {item.samples}) + "
            f"{self.drain_margin_s:g} s drain margin: not admitting"
        )

    def _report(self, message: str) -> None:
        with self._warnings_lock:
            if message in self._warnings:
                return
            self._warnings.append(message)
        if self._warn is not None:
            self._warn(message)
