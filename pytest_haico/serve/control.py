"""`haico serve --list`, `haico serve status NAME` and `haico serve stop NAME`: the catalogue's
entries, and the other jobs of a name in the queue (a renewal's successor, a draining
predecessor)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from pytest_haico import httpclient
from pytest_haico.errors import CatalogueError
from pytest_haico.files import shown_path
from pytest_haico.serve.catalogue import check_catalogue_dir, deregister, entry_path, read_entry
from pytest_haico.serve.resolver import list_served, resolve_served, staleness
from pytest_haico.serve.submission import job_name
from pytest_haico.slurm.client import SlurmError
from pytest_haico.slurm.jobs import cancel, jobs_named

Say = Callable[[str], None]
STOP_WAIT_S = 60.0  # how long `stop` waits for the job to deregister (its KillWait and more)


def list_catalogue(catalogue: Path, *, say: Say) -> int:
    """One line per name: where it answers and until when, or why it cannot be used."""
    listings = list_served(catalogue)
    if not listings:
        say(f"haico: no model is served in {shown_path(catalogue)}")
        return 0
    width = max(len(listing.name) for listing in listings)
    for listing in listings:
        entry = listing.entry
        if entry is None:
            say(f"{listing.name:<{width}}  not available: {listing.problem}")
            continue
        if listing.problem is not None:
            say(f"{listing.name:<{width}}  not available: {listing.problem}")
        else:
            until = entry.job.end_time or "no time limit"
            say(
                f"{listing.name:<{width}}  {entry.endpoint}  served_name={entry.served_name}  "
                f"arm {entry.arm}, job {entry.job.id} on {entry.job.node} until {until}"
            )
        others = _other_jobs(listing.name, entry.job.id)
        if others:
            say(f"{'':<{width}}  {others}")
    return 0


def _other_jobs(name: str, job_id: str) -> str:
    """The name's other jobs in the queue ("" for none, or when Slurm cannot say)."""
    try:
        jobs = jobs_named(job_name(name))
    except SlurmError:
        return ""
    others = ", ".join(f"{other} {state}" for other, state in jobs.items() if other != job_id)
    return f"also in the queue: job {others}" if others else ""


def status(catalogue: Path, name: str, *, say: Say) -> int:
    """The entry, its job and its health; 0 when it answers, 1 when it is stale or does not."""
    entry = read_entry(catalogue, name)
    say(f"{name}: arm {entry.arm}, served_name={entry.served_name}, owner {entry.owner.name}")
    say(f"  endpoint: {entry.endpoint} (key file {shown_path(catalogue / entry.key_file)})")
    job, until = entry.job, entry.job.end_time or "no time limit"
    say(f"  job: {job.id} on {job.node}, restart {job.restart_count}, until {until}")
    say(f"  registered: {entry.registered_at}")
    others = _other_jobs(name, job.id)
    if others:
        say(f"  {others}")
    say(f"  model: {entry.identity.model}")
    vllm = " ".join(
        f"{key}={json.dumps(value)}" for key, value in sorted(entry.identity.vllm.items())
    )
    say(f"  vllm {entry.identity.vllm_version or '(version unknown)'}: {vllm}")
    problem = staleness(entry)
    if problem is not None:
        say(f"  not available: {problem}")
        return 1
    health = f"http://{entry.host}:{entry.port}/health"
    try:
        answer = httpclient.get(health, timeout=5.0)
    except httpx.HTTPError as exc:
        say(f"  unhealthy: GET {health}: {type(exc).__name__}")
        return 1
    say(f"  {'healthy' if answer.is_success else 'unhealthy'}: GET {health} {answer.status_code}")
    return 0 if answer.is_success else 1


def stop(catalogue: Path, name: str, *, say: Say) -> int:
    """Cancel the model job (it deregisters as it ends) and wait for its entry to go; a
    stale entry is removed at once. Then cancel the name's other jobs (a queued successor)."""
    try:
        served = resolve_served(name, catalogue=catalogue)
    except CatalogueError:
        if not entry_path(catalogue, name).exists():
            check_catalogue_dir(catalogue)  # none: that error, as it is
            if _cancel_others(name, None, say=say):
                return 0
        entry = read_entry(catalogue, name)  # unknown or untrusted: that error, as it is
        deregister(catalogue, name, job_id=entry.job.id, restart_count=entry.job.restart_count)
        say(f"haico: removed the stale entry of {name!r} ({staleness(entry)})")
        _cancel_others(name, entry.job.id, say=say)
        return 0
    status = _cancel_and_wait(catalogue, name, served.entry.job.id, say=say)
    _cancel_others(name, served.entry.job.id, say=say)
    return status


def _cancel_others(name: str, job_id: str | None, *, say: Say) -> bool:
    """Cancel the name's jobs in the queue but `job_id` (whose end is awaited already);
    whether there were any. Its successor is queued before it deregisters, so none is missed."""
    others = {i: state for i, state in jobs_named(job_name(name)).items() if i != job_id}
    for other, state in others.items():
        cancel(other)
        say(f"haico: cancelled job {other} of {name!r} ({state})")
    return bool(others)


def _cancel_and_wait(catalogue: Path, name: str, job_id: str, *, say: Say) -> int:
    """Cancel the job serving `name`; 0 once it deregistered, 1 if not in time."""
    cancel(job_id)
    say(f"haico: cancelled job {job_id} serving {name!r}; waiting for it to deregister")
    path = entry_path(catalogue, name)
    deadline = time.monotonic() + STOP_WAIT_S
    while time.monotonic() < deadline:
        try:
            gone = read_entry(catalogue, name).job.id != job_id  # a successor's is not its
        except CatalogueError:
            gone = not path.exists()
        if gone:
            say(f"haico: {name!r} deregistered")
            return 0
        time.sleep(0.5)
    say(f"haico: job {job_id} has not deregistered {name!r} within {STOP_WAIT_S:.0f} s")
    return 1
