"""Campaign tests run outside Slurm, whatever the shell that started pytest had set."""

from __future__ import annotations

import pytest

from tests.harness import clear_campaign_environment


@pytest.fixture(autouse=True)
def _outside_slurm(monkeypatch: pytest.MonkeyPatch) -> None:
    clear_campaign_environment(monkeypatch)
