"""The results layout, from one owner: where a campaign's arms, ledgers, transcripts and run
directories are, and the names of the files a run leaves.

    <results>/<campaign>/
        submissions/                      `haico submit`'s frozen inputs and journals
        <arm>/
            ledger/<run_id>.jsonl         one record per item attempt
            transcripts/<item_id>.<run_id>.<attempt>.jsonl
            runs/<run_id>/                claim.json, run-config.env/.json, timeline.json,
                                          model-metrics.csv, gates.json, logs/, dumps/
            claims/                       which live run holds each share

Pure path arithmetic on the standard library: the recorder (`ledger.rundir`), the results
API, the report and `haico validate` all import it, none of them pays for pydantic.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

LEDGER_SUFFIX = ".jsonl"
SUBMISSIONS = "submissions"  # beside the arms, never one of them
RUN_CONFIG_ENV = "run-config.env"
RUN_CONFIG_JSON = "run-config.json"
CLAIM_FILE = "claim.json"


class _Share(Protocol):
    """A shard of the items (`config.settings.Shard`)."""

    @property
    def index(self) -> int: ...

    @property
    def count(self) -> int: ...


@dataclass(frozen=True)
class TranscriptName:
    """What a transcript's file name says: whose attempt it holds."""

    item_id: str
    run_id: str
    attempt: int


@dataclass(frozen=True)
class ArmPaths:
    """Where one arm's results live: `<results>/<campaign>/<arm>/`."""

    root: Path

    @property
    def ledger_dir(self) -> Path:
        return self.root / "ledger"

    @property
    def transcripts_dir(self) -> Path:
        return self.root / "transcripts"

    @property
    def runs_dir(self) -> Path:
        return self.root / "runs"

    @property
    def claims_dir(self) -> Path:
        return self.root / "claims"

    def ledger(self, run_id: str) -> Path:
        return self.ledger_dir / f"{run_id}{LEDGER_SUFFIX}"

    def run_dir(self, run_id: str) -> Path:
        return self.runs_dir / run_id

    def transcript(self, item_id: str, run_id: str, attempt: int) -> Path:
        return self.transcripts_dir / transcript_name(item_id, run_id, attempt)

    def share_claim(self, shard: _Share, stratum: str, *, list_key: str | None = None) -> Path:
        """The claim of a shard × stratum; `list_key` names the --haico-items list whose
        shard (by position in the list) it is."""
        listed = f".items-{list_key}" if list_key else ""
        return self.claims_dir / f"shard-{shard.index}of{shard.count}{listed}.{stratum}.json"

    def ledger_names(self) -> list[str]:
        """The file names of the arm's ledgers, sorted (one scandir: no stat per file);
        OSError when the directory cannot be listed."""
        return sorted(
            entry.name for entry in os.scandir(self.ledger_dir) if is_ledger_name(entry.name)
        )


def transcript_name(item_id: str, run_id: str, attempt: int) -> str:
    return f"{item_id}.{run_id}.{attempt}{LEDGER_SUFFIX}"


def parse_transcript_name(name: str) -> TranscriptName | None:
    """`transcript_name` reversed; None for a name that is not a transcript's."""
    if not name.endswith(LEDGER_SUFFIX):
        return None
    item_id, _, rest = name.partition(".")
    run_id, _, attempt = rest.removesuffix(LEDGER_SUFFIX).rpartition(".")
    if not item_id or not run_id or not attempt.isdigit():
        return None
    return TranscriptName(item_id, run_id, int(attempt))


def is_ledger_name(name: str) -> bool:
    return name.endswith(LEDGER_SUFFIX)


def run_id_of_ledger(ledger: Path) -> str:
    """The run whose ledger `ledger` is (`ArmPaths.ledger` reversed)."""
    return ledger.name.removesuffix(LEDGER_SUFFIX)


def arm_of_ledger(ledger: Path) -> ArmPaths | None:
    """The arm whose ledger directory holds `ledger`, a file `<arm>/ledger/<run_id>.jsonl`."""
    if ledger.suffix != LEDGER_SUFFIX or ledger.parent.name != "ledger":
        return None
    return ArmPaths(ledger.parent.parent)


def arm_of_run_dir(run_dir: Path) -> ArmPaths | None:
    """The arm of `run_dir`, a directory `<arm>/runs/<run_id>` beside the arm's ledgers."""
    arm = ArmPaths(run_dir.parent.parent)
    return arm if run_dir.parent.name == "runs" and is_arm_dir(arm.root) else None


def run_dir_of_ledger(ledger: Path) -> Path:
    """The run directory of the run that appends to `ledger`."""
    return ArmPaths(ledger.parent.parent).run_dir(run_id_of_ledger(ledger))


def is_arm_dir(path: Path) -> bool:
    """Whether `path` is an arm's results directory (it has a ledger directory)."""
    return path.name != SUBMISSIONS and (path / "ledger").is_dir()


def iter_arm_dirs(campaign_dir: Path) -> Iterator[Path]:
    """The arms' directories of a campaign, by name; OSError when it cannot be listed."""
    return (path for path in sorted(campaign_dir.iterdir()) if is_arm_dir(path))
