"""`haico serve --list`, `haico serve status NAME` and `haico serve stop NAME`."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from pytest_haico.errors import CatalogueError
from pytest_haico.serve.catalogue import deregister, entry_path, read_entry
from pytest_haico.serve.resolver import list_served, resolve_served, staleness
from pytest_haico.slurm.jobs import cancel

Say = Callable[[str], None]
STOP_WAIT_S = 60.0  # how long `stop` waits for the job to deregister (its KillWait and more)


def list_catalogue(catalogue: Path, *, say: Say) -> int:
    """One line per name: where it answers and until when, or why it cannot be used."""
    listings = list_served(catalogue)
    if not listings:
        say(f"haico: no model is served in {catalogue}")
        return 0
    width = max(len(listing.name) for listing in listings)
    for listing in listings:
        entry = listing.entry
        if entry is None or listing.problem is not None:
            say(f"{listing.name:<{width}}  not available: {listing.problem}")
            continue
        until = entry.job.end_time or "no time limit"
        say(
            f"{listing.name:<{width}}  {entry.endpoint}  served_name={entry.served_name}  "
            f"arm {entry.arm}, job {entry.job.id} on {entry.job.node} until {until}"
        )
    return 0


def status(catalogue: Path, name: str, *, say: Say) -> int:
    """The entry, its job and its health; 0 when it answers, 1 when it is stale or does not."""
    entry = read_entry(catalogue, name)
    say(f"{name}: arm {entry.arm}, served_name={entry.served_name}, owner {entry.owner.name}")
    say(f"  endpoint: {entry.endpoint} (key file {catalogue / entry.key_file})")
    job, until = entry.job, entry.job.end_time or "no time limit"
    say(f"  job: {job.id} on {job.node}, restart {job.restart_count}, until {until}")
    say(f"  registered: {entry.registered_at}")
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
        answer = httpx.get(health, timeout=5.0, trust_env=False)
    except httpx.HTTPError as exc:
        say(f"  unhealthy: GET {health}: {type(exc).__name__}")
        return 1
    say(f"  {'healthy' if answer.is_success else 'unhealthy'}: GET {health} {answer.status_code}")
    return 0 if answer.is_success else 1


def stop(catalogue: Path, name: str, *, say: Say) -> int:
    """Cancel the model job (it deregisters as it ends) and wait for its entry to go; a
    stale entry is removed at once."""
    try:
        served = resolve_served(name, catalogue=catalogue)
    except CatalogueError:
        entry = read_entry(catalogue, name)  # unknown or untrusted: that error, as it is
        deregister(catalogue, name, job_id=entry.job.id)
        say(f"haico: removed the stale entry of {name!r} ({staleness(entry)})")
        return 0
    job_id = served.entry.job.id
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
