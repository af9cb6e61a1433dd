"""Renewal of a served model before its walltime: bounded by the service's deadline, opt-in.

`haico serve <arm> --time T --until D [--renew-lead M]` serves for D in all, as a chain of
jobs of at most T each. Once healthy and registered, a job queues its successor with
`--dependency=after:<its id>+<T - M>` (Slurm makes it eligible that many minutes after this
job started, M minutes before its end), with the time limit left before the deadline (at
most T); a job whose own end reaches the deadline queues none. The deadline is absolute
(UTC), so every job of the chain keeps it. The successor registers once healthy, in the old
job's place; the old job sees another job's id in the entry and drains: it stops once its
server runs no request, or after `DRAIN_LIMIT_S`, and leaves the entry to its successor.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

import httpx

from pytest_haico import httpclient
from pytest_haico.durations import MINUTE
from pytest_haico.errors import ConfigError
from pytest_haico.provenance.model_server import parse_metrics
from pytest_haico.slurm.timelimits import parse_time_limit

DEFAULT_LEAD_MIN = 15  # or half the time limit, when that is less
DRAIN_LIMIT_S = 300.0  # the longest a replaced job waits for its requests to finish
_BUSY = ("vllm:num_requests_running", "vllm:num_requests_waiting")


@dataclass(frozen=True)
class Renewal:
    """The service's deadline (UTC) and how many minutes before a job's end its successor
    becomes eligible."""

    until: datetime
    lead_min: int


@dataclass(frozen=True)
class Successor:
    """The next job of the chain: eligible `delay_min` minutes after its predecessor
    started, with time limit `time_min` minutes."""

    delay_min: int
    time_min: int

    def dependency(self, job_id: str) -> str:
        return f"--dependency=after:{job_id}+{self.delay_min}"


def minutes(seconds: float) -> int:
    """Whole minutes, rounded up as Slurm counts a time limit."""
    return max(1, math.ceil(seconds / MINUTE - 1e-9))


def resolve_renewal(
    *, time: str | None, until: str | None, lead: str | None, now: datetime
) -> Renewal | None:
    """The renewal `--until` and `--renew-lead` ask for (None without `--until`); a
    `ConfigError` naming the option for one that cannot be met."""
    if until is None:
        if lead is not None:
            raise ConfigError("--renew-lead", "", "renews only a service with --until")
        return None
    service_s = parse_time_limit(until, where="--until")
    if service_s is None:
        raise ConfigError("--until", "", f"{until!r} is no end: give the total service time")
    if time is None:
        raise ConfigError(
            "--until", "", "renewal needs each job's time limit: give --time (or [slurm] time)"
        )
    time_s = parse_time_limit(time, where="--time")
    if time_s is None:
        raise ConfigError("--time", "", f"{time!r} has no end, so it needs no renewal (--until)")
    time_min = minutes(time_s)
    if service_s < time_s:
        raise ConfigError(
            "--until", "", f"{until} is shorter than --time {time}: serve for --time alone"
        )
    if lead is None:
        lead_min = min(DEFAULT_LEAD_MIN, time_min // 2)
    else:
        lead_s = parse_time_limit(lead, where="--renew-lead")
        lead_min = 0 if lead_s is None else minutes(lead_s)
    if not 1 <= lead_min < time_min:
        raise ConfigError(
            "--renew-lead",
            "",
            f"{lead_min} min is not between 1 min and --time {time} ({time_min} min): the "
            "successor must be queued before this job ends",
        )
    return Renewal(until=now + timedelta(seconds=service_s), lead_min=lead_min)


def plan_successor(*, started: datetime, time_min: int, renewal: Renewal) -> Successor | None:
    """The successor of a job that `started` with `time_min` minutes, or None when its end
    reaches the deadline (or its time leaves no minute before the lead)."""
    delay_min = time_min - renewal.lead_min
    if delay_min < 1 or started + timedelta(minutes=time_min) >= renewal.until:
        return None
    eligible = started + timedelta(minutes=delay_min)
    left_min = int((renewal.until - eligible).total_seconds() // MINUTE)
    return Successor(delay_min=delay_min, time_min=min(time_min, left_min))


def drain(
    idle: Callable[[], bool], *, ended: Callable[[], bool], limit_s: float = DRAIN_LIMIT_S
) -> Literal["idle", "limit", "ended"]:
    """Wait until `idle()`, at most `limit_s`; `ended()` waits between two looks and says
    whether the wait is over anyway (a signal, the server's death). What ended it."""
    deadline = time.monotonic() + limit_s
    while not idle():
        if time.monotonic() > deadline:
            return "limit"
        if ended():
            return "ended"
    return "idle"


def is_idle(metrics_url: str, api_key: str) -> bool:
    """Whether the server runs no request and has none waiting (its `/metrics`); a server
    that does not answer runs none that could finish."""
    try:
        answer = httpclient.get(
            metrics_url, headers={"Authorization": f"Bearer {api_key}"}, timeout=5.0
        )
    except httpx.HTTPError:
        return True
    if not answer.is_success:
        return True
    found = parse_metrics(answer.text.splitlines())
    return not any(found.get(name, 0.0) for name in _BUSY)
