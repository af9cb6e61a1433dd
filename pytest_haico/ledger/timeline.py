"""A run's timeline (`runs/<run_id>/timeline.json`, schema 1): when the job was queued and
started, when each phase of the run began and ended, and how it exited.

The whole document is rewritten atomically (`files.write_atomic`) at every phase change, so
a run killed at any point leaves the timeline of what it had done, never a torn file."""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest_haico
from pytest_haico.durations import format_duration
from pytest_haico.files import DEFAULT_FILE_MODE, write_atomic
from pytest_haico.procfs import read_proc_stat

_log = logging.getLogger(__name__)

SCHEMA = 1
FILE_NAME = "timeline.json"
# The phases, in the order a run goes through them (a run may stop before any of them).
PHASES = (
    "static_gates",
    "stack",
    "dynamic_gates",
    "conversing",
    "drain",
    "final_dump",
    "stop",
)
STARTING = ("static_gates", "stack", "dynamic_gates")
DRAIN_CAUSES = {"signal", "walltime", "breaker", "stopped"}
# An interpreter and pytest start and load their plugins well within this, even loaded.
EXEC_SLACK_S = 10.0


def _gpus(env: Mapping[str, str]) -> int | None:
    """The allocation's GPU count from Slurm's environment, or None where it says nothing."""
    for key in ("SLURM_GPUS_ON_NODE", "SLURM_GPUS", "SLURM_JOB_GPUS"):
        raw = env.get(key, "").strip()
        if not raw:
            continue
        if raw.isdigit():
            return int(raw)
        return len([part for part in raw.split(",") if part])  # a list of GPU indices
    return None


def job_section(
    env: Mapping[str, str], *, queued_at: float | None = None, started_at: float | None = None
) -> dict[str, Any] | None:
    """The `job` section from Slurm's environment (None off Slurm); `queued_at`, the job's
    submit time, is filled in once Slurm's controller has answered (`RunTimeline`)."""
    job_id = env.get("SLURM_JOB_ID")
    if not job_id:
        return None
    if started_at is None:
        raw = env.get("SLURM_JOB_START_TIME", "")
        started_at = float(raw) if raw.isdigit() else None
    return {"id": job_id, "gpus": _gpus(env), "queued_at": queued_at, "started_at": started_at}


def process_started_at() -> float:
    """When this pytest process started (epoch seconds): boot time + its start ticks, from
    /proc. A process keeps its start across exec, so where that lies more than
    `EXEC_SLACK_S` before pytest-haico was loaded, pytest replaced a longer-lived process
    (`exec pytest` in a script, the last command of `bash -c '… && pytest'`) and the load
    is the start; so it is where /proc cannot tell."""
    loaded = pytest_haico.LOADED_AT
    stat = read_proc_stat(os.getpid())
    if stat is None:
        return loaded
    try:
        with open("/proc/stat") as f:
            btime = next(int(line.split()[1]) for line in f if line.startswith("btime "))
    except (OSError, StopIteration, ValueError):
        return loaded
    started = btime + stat.start_time / os.sysconf("SC_CLK_TCK")
    return started if loaded - started <= EXEC_SLACK_S else loaded


class Timeline:
    """The timeline of one run, written to `run_dir/timeline.json` after every change."""

    def __init__(
        self,
        run_dir: Path,
        *,
        run_id: str,
        campaign: str,
        arm: str,
        session: str,
        job: dict[str, Any] | None,
        clock: Any = time.time,
        file_mode: int = DEFAULT_FILE_MODE,
    ) -> None:
        self.path = run_dir / FILE_NAME
        self._clock = clock
        self._mode = file_mode
        self.write_failure: OSError | None = None  # the first write that failed
        self.doc: dict[str, Any] = {
            "schema": SCHEMA,
            "run_id": run_id,
            "campaign": campaign,
            "arm": arm,
            "session": session,
            "job": job,
            "process_started_at": process_started_at(),
            "phases": {},
            "exit": None,
            "model": None,
        }
        self._write()

    def _write(self) -> None:
        """The whole document, atomically; a failure is logged once and kept, never raised:
        the timeline is an account of the run, not a reason to stop it (its run's start
        decides on `write_failure`)."""
        data = json.dumps(self.doc, indent=1, sort_keys=True) + "\n"
        try:
            write_atomic(self.path, data.encode(), mode=self._mode)
        except OSError as exc:
            if self.write_failure is None:
                self.write_failure = exc
                _log.warning("haico: %s could not be written: %s", self.path, exc)

    def _phase(self, name: str) -> dict[str, Any]:
        if name not in PHASES:
            raise ValueError(f"timeline: unknown phase {name!r} (one of {', '.join(PHASES)})")
        phase: dict[str, Any] = self.doc["phases"].setdefault(name, {})
        return phase

    def start(self, name: str, **fields: Any) -> None:
        """Phase `name` began now (a second start keeps the first)."""
        phase = self._phase(name)
        phase.setdefault("start", self._clock())
        phase.update(fields)
        self._write()

    def end(self, name: str, **fields: Any) -> None:
        """Phase `name` ended now (a second end moves it later)."""
        phase = self._phase(name)
        now = self._clock()
        phase.setdefault("start", now)
        phase["end"] = now
        phase.update(fields)
        self._write()

    def span(self, name: str, *, start: float, end: float) -> None:
        """Phase `name` ran from `start` to `end`: one timed before the timeline existed."""
        self._phase(name).update(start=start, end=end)
        self._write()

    def service(self, name: str, *, started: float, healthy: float | None) -> None:
        """A service of the stack was started and (where it got there) answered healthy."""
        services = self._phase("stack").setdefault("services", {})
        services[name] = {"start": started, "healthy": healthy}
        self._write()

    def conversation(self, *, start: float, end: float) -> None:
        """One conversation ran from `start` to `end`: widens `conversing`."""
        phase = self._phase("conversing")
        phase["first_start"] = min(phase.get("first_start", start), start)
        phase["last_end"] = max(phase.get("last_end", end), end)
        self._write()

    def drain(self, cause: str, *, signal: str | None = None, write: bool = True) -> None:
        """The run began draining for `cause` (the first cause wins); with `write` off it
        is only noted, for the next change to write (a signal handler writes no file)."""
        if cause not in DRAIN_CAUSES:
            raise ValueError(
                f"timeline: drain cause {cause!r} is not one of {sorted(DRAIN_CAUSES)}"
            )
        phase = self._phase("drain")
        if "cause" not in phase:
            phase.update(start=self._clock(), cause=cause, signal=signal)
            if write:
                self._write()

    def note(self, key: str, value: Any) -> None:
        """A top-level section (`concurrency`), written with the next change."""
        self.doc[key] = value

    def model(self, summary: dict[str, Any]) -> None:
        """The sampler's summary of the model's utilisation."""
        self.doc["model"] = summary
        self._write()

    def exit(self, code: int) -> None:
        self.doc["exit"] = {"at": self._clock(), "code": code}
        self._write()


def _span(phase: Mapping[str, Any], start: str = "start", end: str = "end") -> float:
    first, last = phase.get(start), phase.get(end)
    if isinstance(first, int | float) and isinstance(last, int | float) and last >= first:
        return float(last - first)
    return 0.0


def shares(doc: Mapping[str, Any]) -> dict[str, Any]:
    """Where the allocation went: its length (s, from the job's start or the process's
    start to the exit), GPU-hours where the job has GPUs, and the share of it spent
    starting (gates and stack), conversing, draining and dumping."""
    phases: Mapping[str, Any] = doc.get("phases") or {}
    job = doc.get("job") or {}
    began = job.get("started_at") or doc.get("process_started_at")
    ended = (doc.get("exit") or {}).get("at")
    if ended is None:
        ends = [v for p in phases.values() for k, v in p.items() if k in ("end", "last_end")]
        ended = max(ends, default=None)
    total = float(ended - began) if began is not None and ended is not None else 0.0
    parts = {
        "starting": sum(
            _span(phases.get(n, {})) for n in ("static_gates", "stack", "dynamic_gates")
        ),
        "conversing": _span(phases.get("conversing", {}), "first_start", "last_end"),
        "draining": _span(phases.get("drain", {})),
        "dumping": _span(phases.get("final_dump", {})),
    }
    gpus = job.get("gpus")
    return {
        "allocation_s": total,
        "gpu_hours": total * gpus / 3600 if gpus else None,
        **{name: (span / total if total > 0 else 0.0) for name, span in parts.items()},
    }


def shares_line(doc: Mapping[str, Any]) -> str:
    """`allocation 2m05s (0.07 GPU-h): starting 12%, conversing 80%, draining 3%, dumping 1%`."""
    got = shares(doc)
    gpu = f" ({got['gpu_hours']:.2f} GPU-h)" if got["gpu_hours"] is not None else ""
    parts = ", ".join(
        f"{name} {got[name]:.0%}" for name in ("starting", "conversing", "draining", "dumping")
    )
    return f"allocation {format_duration(got['allocation_s'])}{gpu}: {parts}"
