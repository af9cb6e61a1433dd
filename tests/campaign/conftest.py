"""A campaign directory written into pytester's tmp path, and readers for its results."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path
from typing import Any

import pytest

# The body of the campaign's test: what each item does is driven by its first turn's
# text, so a test can mix passing, failing and infra-failing items in one campaign.
TEST_MODULE = """
import os
import time

from pytest_haico import InfraError, RateLimitedError


def test_conversation(haico_item):
    time.sleep(float(os.environ.get("HAICO_TEST_ITEM_SECONDS", "0")))
    text = haico_item.script.turns[0].user
    if text.startswith("infra"):
        raise InfraError("backend unreachable: connection refused")
    if text.startswith("ratelimit"):
        raise RateLimitedError("429 from the backend")
    if text.startswith("flip") and os.environ.get("HAICO_TEST_FLIP") != "1":
        raise InfraError("flaky until HAICO_TEST_FLIP=1")
    if text.startswith("interrupt") and os.environ.get("HAICO_TEST_FLIP") != "1":
        raise KeyboardInterrupt
    assert not text.startswith("fail"), "the model said something else"
"""


class CampaignDir:
    """An experiments directory under `pytester.path`, and what runs left in results/."""

    def __init__(self, pytester: pytest.Pytester) -> None:
        self.pytester = pytester
        self.root = pytester.path
        self.experiments = self.root / "experiments"
        (self.experiments / "arms").mkdir(parents=True)
        (self.experiments / "scripts").mkdir()
        (self.experiments / "test_conversations.py").write_text(TEST_MODULE)
        pytester.makepyprojecttoml(
            '[tool.pytest.ini_options]\nasyncio_default_fixture_loop_scope = "function"\n'
        )

    def arm(self, name: str, text: str = "") -> Path:
        path = self.experiments / "arms" / f"{name}.toml"
        path.write_text(textwrap.dedent(text))
        return path

    def scripts(self, filename: str, text: str) -> Path:
        path = self.experiments / "scripts" / filename
        path.write_text(textwrap.dedent(text))
        return path

    def simple_scripts(self, *ids: str, stratum: str = "default", text: str = "hello") -> Path:
        docs = [
            {"id": sid, "stratum": stratum, "turns": [{"user": f"{text} {sid}"}]} for sid in ids
        ]
        return self.scripts(f"{ids[0]}.jsonl", "\n".join(json.dumps(d) for d in docs) + "\n")

    def run(self, *args: str, subprocess: bool = False) -> pytest.RunResult:
        """Run the campaign in-process, or in a subprocess where a real interrupt is the point."""
        run = self.pytester.runpytest_subprocess if subprocess else self.pytester.runpytest
        return run("experiments", "-p", "no:cacheprovider", *args)

    def ledger_files(self, arm: str, campaign: str = "default") -> list[Path]:
        return sorted((self.root / "results" / campaign / arm / "ledger").glob("*.jsonl"))

    def records(self, arm: str, campaign: str = "default") -> list[dict[str, Any]]:
        return [
            json.loads(line)
            for path in self.ledger_files(arm, campaign)
            for line in path.read_text().splitlines()
            if line.strip()
        ]


@pytest.fixture(autouse=True)
def _outside_slurm(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (
        "SLURM_JOB_ID",
        "SLURM_ARRAY_JOB_ID",
        "SLURM_ARRAY_TASK_ID",
        "SLURM_RESTART_COUNT",
        "CLUSTER_WORK",
    ):
        monkeypatch.delenv(name, raising=False)
    for name in list(os.environ):
        if name.startswith("PYTEST_HAICO_"):
            monkeypatch.delenv(name)


@pytest.fixture
def campaign(pytester: pytest.Pytester) -> CampaignDir:
    """An empty campaign; add arms and scripts, then `run`."""
    return CampaignDir(pytester)
