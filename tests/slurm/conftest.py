"""Real Slurm clusters for the tests marked `slurm` (conftest.py marks this folder's): started
once per session, stopped by PID."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.slurm.cluster import SlurmCluster, missing_requirements
from tests.slurm.nodes import MultiNodeCluster, missing_namespace_requirements


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """munged, slurmctld and slurmd in a private 0700 directory, for the whole session."""
    reason = missing_requirements()
    if reason is not None:
        pytest.skip(f"no real Slurm here: {reason}")
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm", numbered=True) / "cluster")
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def slurm_nodes(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Callable[[int], MultiNodeCluster]]:
    """``slurm_nodes(3)``: a cluster of 3 compute nodes and a login node, each a namespace,
    started on first use and shared by the session (one per node count). A test that breaks a
    node makes its own `MultiNodeCluster` instead."""
    reason = missing_requirements() or missing_namespace_requirements()
    if reason is not None:
        pytest.skip(f"no multi-node Slurm here: {reason}")
    clusters: dict[int, MultiNodeCluster] = {}

    def cluster_of(count: int) -> MultiNodeCluster:
        if count not in clusters:
            base = tmp_path_factory.mktemp(f"slurm{count}n", numbered=True) / "cluster"
            cluster = MultiNodeCluster(base, count=count)
            cluster.start()  # a start that fails stops what it made
            clusters[count] = cluster
        return clusters[count]

    try:
        yield cluster_of
    finally:
        for cluster in clusters.values():
            cluster.stop()


@pytest.fixture
def broken_cluster(tmp_path: Path) -> Iterator[MultiNodeCluster]:
    """A three-node cluster of the test's own, for a test that breaks a node."""
    reason = missing_requirements() or missing_namespace_requirements()
    if reason is not None:
        pytest.skip(f"no multi-node Slurm here: {reason}")
    cluster = MultiNodeCluster(tmp_path / "cluster", count=3)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()
