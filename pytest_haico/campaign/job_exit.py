"""A batch job's exit code when pytest ended without one of campaign mode's (0, 75, 78, 4):
killed by a signal (a `kill -9`, a TERM during its own exit), 75 if its items are still owed
a record and 0 if not, from its ledgers; any other code is 4. What a killed run's pg_dump
(killed with it) left of a dump is removed.

The batch script makes a node-local file and names it in `RUN_ITEMS_ENV`; once the run has
claimed its run directories the plugin writes there each ledger it appends to and the items
it set out to record in it. After pytest ends, the script runs
``python -m pytest_haico.campaign.job_exit STATUS FILE``, which says why on stderr and exits
with the job's code.
"""

from __future__ import annotations

import json
import signal
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from pytest_haico.errors import UntrustedFileError
from pytest_haico.files import PRIVATE_FILE_MODE, read_owned_file, write_atomic
from pytest_haico.ledger.format import UnreadableLedgerError, iter_ledger
from pytest_haico.ledger.layout import run_dir_of_ledger
from pytest_haico.ledger.resume import ResumeIndex
from pytest_haico.provenance.dumps import remove_partial_dumps, run_dumps_dir

RUN_ITEMS_ENV = "HAICO_RUN_ITEMS"
EXIT_FINISHED = 0
EXIT_USAGE = 4
EXIT_RESUBMIT = 75
CAMPAIGN_CODES = frozenset({0, 4, 75, 78})


def write_run_items(path: Path, items: Mapping[Path, Sequence[str]]) -> None:
    """Write, whole, the ledgers of this run and the item ids each is to record."""
    document = {"ledgers": [{"path": str(p), "items": list(ids)} for p, ids in items.items()]}
    write_atomic(path, json.dumps(document).encode(), mode=PRIVATE_FILE_MODE)


def read_run_items(path: Path) -> dict[Path, list[str]] | None:
    """What `write_run_items` wrote; None when nothing was (pytest died before its items
    were chosen) or the file is not this user's own regular file."""
    try:
        document = json.loads(read_owned_file(path) or b"null")
        return {Path(e["path"]): [str(i) for i in e["items"]] for e in document["ledgers"]}
    except (OSError, UntrustedFileError, ValueError, TypeError, KeyError):
        return None


def owed_items(items: Mapping[Path, Sequence[str]]) -> int:
    """How many of `items` have no terminal record in their ledger; an unreadable ledger
    owes all of its items."""
    owed = 0
    for ledger, ids in items.items():
        index = ResumeIndex()
        try:
            index.add_all(iter_ledger(ledger, warn=_warn, resume_fields=True), warn=_warn)
        except UnreadableLedgerError as exc:
            _warn(str(exc))
            owed += len(ids)
            continue
        owed += sum(1 for i in ids if (prior := index.get(i)) is None or not prior.done)
    return owed


def job_exit(status: int, run_items: Path) -> tuple[int, str]:
    """The job's exit code for pytest's `status`, and the line that says why."""
    if status in CAMPAIGN_CODES:
        return status, f"pytest ended with exit {status}"
    if status <= 128:
        return EXIT_USAGE, (
            f"pytest ended with exit {status}, none of campaign mode's codes (a crash or a "
            f"broken environment: its log above says which): exit {EXIT_USAGE}"
        )
    killed = f"pytest was killed by {_signal_name(status - 128)} (exit {status})"
    items = read_run_items(run_items)
    if items is None:
        return EXIT_RESUBMIT, (
            f"{killed} before it had chosen its items: nothing of this run is recorded; exit "
            f"{EXIT_RESUBMIT}, resubmit to continue"
        )
    total = sum(len(ids) for ids in items.values())
    owed = owed_items(items)
    if owed:
        return EXIT_RESUBMIT, (
            f"{killed}; {owed} of its {total} item(s) have no final record in its ledgers: "
            f"exit {EXIT_RESUBMIT}, resubmit to continue"
        )
    return EXIT_FINISHED, f"{killed} after all of its {total} item(s) were recorded: exit 0"


def remove_killed_dumps(run_items: Path) -> list[Path]:
    """Remove the partial dump files of the runs in `run_items`, which pytest's death (and
    their pg_dump's with it) left behind; the paths removed."""
    items = read_run_items(run_items) or {}
    return [
        partial
        for ledger in items
        for partial in remove_partial_dumps(run_dumps_dir(run_dir_of_ledger(ledger)))
    ]


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _warn(message: str) -> None:
    print(f"haico: {message}", file=sys.stderr)


def main(argv: Sequence[str]) -> int:
    if len(argv) != 2 or not argv[0].isdigit():
        _warn("usage: python -m pytest_haico.campaign.job_exit STATUS FILE")
        return EXIT_USAGE
    status, run_items = int(argv[0]), Path(argv[1])
    code, why = job_exit(status, run_items)
    _warn(why)
    if status > 128:
        for partial in remove_killed_dumps(run_items):
            _warn(f"removed {partial}: a dump the killed run never completed")
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
