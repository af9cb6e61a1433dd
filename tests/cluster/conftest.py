"""Fixtures of the cluster profile's tests: a scratch site with the vLLM and Apptainer shims."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.cluster.shim_site import ShimSite, scratch_site


@pytest.fixture
def shim_site() -> Iterator[ShimSite]:
    """A scratch CLUSTER_WORK, VLLM_VENV and cluster.env with the shims in place."""
    with scratch_site() as site:
        yield site
