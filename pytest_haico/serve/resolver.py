"""Resolving a served model by name: its catalogue entry, trusted and checked against Slurm.

The API for every client of the catalogue (a campaign's arm, a judge, `haico serve`):

    served = resolve_served("judge", catalogue=Path("/work/me/catalogue"))
    served.endpoint      # "http://gpu07:8000/v1", the OpenAI-compatible base URL
    served.served_name   # the model name to send in requests ("judge")
    served.identity      # ServedIdentity: the weights' identity, the vLLM settings, vLLM's version
    served.key_file      # the API key's file; served.api_key() reads it (guarded)

Resolve again at every attempt: an entry is only as good as its job. It is stale, and
refused, when Slurm no longer runs the job it names, runs it on another node, or has
requeued it since it registered (a requeued job registers again once healthy, with its new
host and port).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pytest_haico.errors import CatalogueError
from pytest_haico.serve.catalogue import (
    CatalogueEntry,
    ServedIdentity,
    entry_names,
    read_entry,
    read_key,
)
from pytest_haico.slurm.client import SlurmError
from pytest_haico.slurm.jobs import job_now
from pytest_haico.slurm.records import JobRecord

# How a job stands now: `slurm.jobs.job_now`, or a stand-in in a unit test.
JobLookup = Callable[[str], JobRecord | None]


@dataclass(frozen=True)
class ServedModel:
    """A served model that a client may use now (its job runs where its entry says)."""

    name: str
    endpoint: str
    served_name: str
    identity: ServedIdentity
    key_file: Path
    entry: CatalogueEntry

    def api_key(self) -> str:
        """The key the server requires, from `key_file` (trust-checked like the entry)."""
        return read_key(self.key_file.parent, self.entry)


def resolve_served(name: str, *, catalogue: Path, lookup: JobLookup = job_now) -> ServedModel:
    """The served model `name` of `catalogue`; a `CatalogueError` of one line when there is
    none, its entry cannot be trusted, or it is stale."""
    entry = read_entry(catalogue, name)
    problem = staleness(entry, lookup)
    if problem is not None:
        raise CatalogueError(
            f"served model {name!r} is not available: {problem} (`haico serve --list` shows "
            "what is served)"
        )
    return ServedModel(
        name=name,
        endpoint=entry.endpoint,
        served_name=entry.served_name,
        identity=entry.identity,
        key_file=catalogue / entry.key_file,
        entry=entry,
    )


def staleness(entry: CatalogueEntry, lookup: JobLookup = job_now) -> str | None:
    """Why the entry no longer describes a running server (None: its job runs as it says).

    When Slurm cannot answer, the entry is not taken on trust either."""
    job = entry.job
    try:
        record = lookup(job.id)
    except SlurmError as exc:
        return f"Slurm cannot say whether its job {job.id} runs ({exc})"
    if record is None:
        return f"its job {job.id} has ended (Slurm no longer knows it)"
    if record.state != "RUNNING":
        return f"its job {job.id} is {record.state}"
    if record.restarts != job.restart_count:
        return (
            f"its job {job.id} was requeued since it registered (restart {record.restarts}); "
            "it registers again once its model is healthy"
        )
    if record.batch_host is not None and record.batch_host != job.node:
        return f"its job {job.id} runs on {record.batch_host}, not on {job.node} as registered"
    return None


@dataclass(frozen=True)
class Listing:
    """One name of the catalogue: its entry, when it can be read, and why it is not usable."""

    name: str
    entry: CatalogueEntry | None
    problem: str | None


def list_served(catalogue: Path, *, lookup: JobLookup = job_now) -> list[Listing]:
    """Every name of the catalogue, each with its entry or what keeps it from being used."""
    listings = []
    for name in entry_names(catalogue):
        try:
            entry = read_entry(catalogue, name)
        except CatalogueError as exc:
            listings.append(Listing(name, None, str(exc)))
            continue
        listings.append(Listing(name, entry, staleness(entry, lookup)))
    return listings
