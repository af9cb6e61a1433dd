"""The demo project against the stand-in Slurm, for the command-level tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.submit.campaign import Campaign, make_project
from tests.submit.fake_slurm import FakeSlurm


@pytest.fixture
def campaign(tmp_path: Path) -> Campaign:
    """The demo project (more items) and the stand-in Slurm its commands see."""
    return Campaign(make_project(tmp_path / "project"), FakeSlurm.install(tmp_path / "slurm"))
