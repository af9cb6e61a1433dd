"""The cluster's nodes: which ones each partition has (`sinfo`)."""

from __future__ import annotations

from pytest_haico.slurm import client as slurm


def parse_partition_nodes(text: str) -> dict[str, tuple[str, ...]]:
    """Partition -> its nodes from ``sinfo -h -N -o "%N %P"`` (a line per node and
    partition; the default partition is marked ``*`` and listed under its plain name and
    under ``""``)."""
    found: dict[str, list[str]] = {}
    for line in text.splitlines():
        words = line.split()
        if len(words) != 2:
            continue
        node, partition = words
        names = [partition.rstrip("*")] + ([""] if partition.endswith("*") else [])
        for name in names:
            nodes = found.setdefault(name, [])
            if node not in nodes:
                nodes.append(node)
    return {name: tuple(nodes) for name, nodes in found.items()}


def read_partition_nodes() -> dict[str, tuple[str, ...]]:
    """Partition -> its nodes ("" for the default partition's); `slurm.SlurmError` when
    sinfo cannot answer."""
    done = slurm.run(["sinfo", "-h", "-N", "-o", "%N %P"]).checked()
    return parse_partition_nodes(done.stdout)
