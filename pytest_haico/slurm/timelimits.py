"""Slurm time limits (as `sbatch --time` takes them) and partitions with their caps and
GPUs per node (as `sinfo` prints them)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

from pytest_haico.config.experiment import Arm
from pytest_haico.durations import MINUTE, slurm_limit_seconds
from pytest_haico.errors import ConfigError
from pytest_haico.slurm import client as slurm


def parse_time_limit(text: str, *, where: str = "a Slurm time limit") -> float | None:
    """Seconds of a limit as `sbatch --time` takes it: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM,
    D-HH:MM:SS; None for "infinite", "UNLIMITED" or 0 (Slurm reads 0 as no limit).

    Anything else is a `ConfigError` naming the value (`where` names its source).
    """
    try:
        return slurm_limit_seconds(text)
    except ValueError as exc:
        raise ConfigError(where, "", str(exc)) from None


def format_time_limit(seconds: float) -> str:
    """`D-HH:MM:SS` (a day or more) or `HH:MM:SS`, rounded up to whole minutes as Slurm
    counts them, and never below one minute (Slurm reads 0 as no limit); `ValueError` for
    a negative or infinite number."""
    if not 0 <= seconds < math.inf:
        raise ValueError(f"a time limit needs a finite number of seconds >= 0, got {seconds}")
    # The epsilon keeps float noise (7200.0000001) from adding a minute.
    minutes = max(1, math.ceil(seconds / MINUTE - 1e-9))
    days, minutes = divmod(minutes, 1440)
    hours, minutes = divmod(minutes, 60)
    clock = f"{hours:02d}:{minutes:02d}:00"
    return f"{days}-{clock}" if days else clock


@dataclass(frozen=True)
class Partition:
    """A Slurm partition and its time cap (None: no cap, or one sinfo did not say), and the
    most GPUs one of its nodes has (None: sinfo did not say)."""

    name: str
    cap_s: float | None
    default: bool
    limit: str = ""  # the limit as sinfo printed it
    gpus_per_node: int | None = None

    @property
    def cap_text(self) -> str:
        if self.cap_s is not None:
            return f"cap {format_time_limit(self.cap_s)}"
        if self.limit.strip().lower() in ("infinite", "unlimited"):
            return "no cap"
        if not self.limit:
            return "cap unknown"
        return f"cap unknown: sinfo printed {self.limit!r}, planned without a cap"


def parse_sinfo(text: str) -> list[Partition]:
    """Partitions from `sinfo -h -o "%P %l %G"` (a line per partition and node
    configuration): the default one is marked `*`; a limit that is not a time (`n/a`) is no
    cap, and `cap_text` says so; the GPUs per node are the most of any line's GRES."""
    found: dict[str, Partition] = {}
    for line in text.splitlines():
        words = line.split()
        if not words:
            continue
        name, limit = words[0], words[1] if len(words) > 1 else ""
        default = name.endswith("*")
        name = name.rstrip("*")
        try:
            cap = parse_time_limit(limit)
        except ConfigError:
            cap = None
        gpus = gres_gpus(words[2]) if len(words) > 2 else None
        known = found.setdefault(name, Partition(name, cap, default, limit, gpus))
        if gpus is not None and (known.gpus_per_node or 0) < gpus:  # the limit: first line's
            found[name] = replace(known, gpus_per_node=gpus)
    return list(found.values())


# One GPU entry of a GRES: gpu:4, gpu:a100:4, gpu:a100:4(S:0-1) (its count before any "(").
_GRES_GPU = re.compile(r"(?:^|,)gpu(?::[^:,(]+)?:(\d+)")


def gres_gpus(gres: str) -> int:
    """The GPUs a GRES names, as sinfo prints a node's (`gpu:a100:4(S:0-1),gpu:v100:2`: 6;
    `(null)`: 0) or sbatch takes one (`gpu:2`)."""
    return sum(int(count) for count in _GRES_GPU.findall(gres))


def read_partitions() -> list[Partition]:
    """The cluster's partitions from sinfo; `slurm.SlurmError` when sinfo cannot answer."""
    return parse_sinfo(slurm.run(["sinfo", "-h", "-o", "%P %l %G"]).checked().stdout)


def resolve_partition(arm: Arm, partitions: list[Partition] | None) -> tuple[Partition | None, str]:
    """The partition the arm's jobs go to: its `[slurm] partition`, else sinfo's default one
    (None: unknown, so no cap applies), and a note saying why when sinfo did not list it.
    With `partitions` None (sinfo unavailable), the arm's partition has no known cap."""
    name = arm.slurm.partition if arm.slurm is not None else None
    if partitions is None:
        return (Partition(name, None, False) if name else None), ""
    if name is None:
        default = next((p for p in partitions if p.default), None)
        return default, "" if default else "sinfo marks no default partition: no cap applied"
    known = next((p for p in partitions if p.name == name), None)
    if known is None:
        return None, (
            f"partition {name!r} ([slurm] partition in arms/{arm.name}.toml) is not in "
            "sinfo's list: no cap applied"
        )
    return known, ""
