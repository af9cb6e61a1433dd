"""A real single-node Slurm for the tests marked `slurm` (conftest.py marks this folder's):
started once, stopped by PID."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.slurm.cluster import SlurmCluster, missing_requirements


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
