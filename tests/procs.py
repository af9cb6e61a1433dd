"""What tests read of other processes in /proc: their environment, and process trees."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from pytest_haico.procfs import iter_processes


def environ(pid: int) -> dict[str, str]:
    """The environment `pid` was started with."""
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    pairs = (entry.partition(b"=") for entry in raw.split(b"\0") if entry)
    return {key.decode(): value.decode(errors="replace") for key, _, value in pairs}


def tree(pids: Iterable[int]) -> set[int]:
    """The live processes among `pids` and every live process under one of them."""
    parents = {stat.pid: stat.ppid for stat in iter_processes()}
    found = {pid for pid in pids if pid in parents}
    while grown := {pid for pid, parent in parents.items() if parent in found} - found:
        found |= grown
    return found


def group_members(pgids: Iterable[int]) -> list[int]:
    """The live processes of the process groups `pgids`."""
    wanted = set(pgids)
    return [stat.pid for stat in iter_processes() if stat.pgid in wanted]
