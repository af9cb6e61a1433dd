"""The chaos benchmark's campaign project: arms of the stand-in model over one stratum of
scripts, with the shipped batch script; one arm may attach to its model served by `haico
serve` (chaos.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest_haico

CAMPAIGN = "chaos"
STRATUM = "work"
SERVED_ARM = "chaos0"  # with `served`: the arm that attaches to its model, by this name
SERVED_EXPERIMENTS = "served"  # the served arm's own experiments, kept out of the campaign's
ARM = """\
description = "chaos arm {n}: the stand-in model, helpful, on the local profile"
[model]
served_name = "chaos{n}"
{served}[run]
concurrency = {concurrency}
turn_timeout_s = 60
[standin]
persona = "helpful"
latency_ms = {latency_ms}
seed = {n}
[slurm]
time = "{time_limit}"
"""
TEST_MODULE = """\
from pytest_haico import Conversation, Verdict


def test_conversation(haico_conversation: Conversation) -> None:
    assert haico_conversation.verdict is Verdict.COMPLETED, haico_conversation.explain()
"""
# langsmith's plugin (the stand-ins' LangChain) costs 0.7 s per pytest start.
PYPROJECT = """\
[tool.pytest.ini_options]
asyncio_default_fixture_loop_scope = "function"
addopts = ["-p", "no:langsmith_plugin"]
"""


def write_project(
    root: Path,
    *,
    arms: int,
    items: int,
    turns: int,
    latency_ms: int,
    concurrency: int,
    time_limit: str,
    served: bool = False,
) -> None:
    """`arms` arms over `items` scripts of `turns` turns in one stratum, and the shipped
    batch script: a project as `haico init` would leave it, made small. With `served`, arm
    chaos0 attaches to the model served under its name, which `<root>/served` holds as an
    arm of its own."""
    experiments = root / "experiments"
    (experiments / "arms").mkdir(parents=True)
    (experiments / "scripts").mkdir()
    for n in range(arms):
        values = {"n": n, "concurrency": concurrency, "latency_ms": latency_ms}
        attach = f'served = "{SERVED_ARM}"\n' if served and n == 0 else ""
        (experiments / "arms" / f"chaos{n}.toml").write_text(
            ARM.format(**values, time_limit=time_limit, served=attach)
        )
    if served:
        (root / SERVED_EXPERIMENTS / "arms").mkdir(parents=True)
        (root / SERVED_EXPERIMENTS / "scripts").mkdir()
        (root / SERVED_EXPERIMENTS / "arms" / f"{SERVED_ARM}.toml").write_text(
            ARM.format(n=0, concurrency=concurrency, latency_ms=latency_ms,
                       time_limit=time_limit, served="")
        )  # fmt: skip
    (experiments / "scripts" / f"{STRATUM}.yaml").write_text(
        "".join(
            f"- id: item{i:03d}\n  stratum: {STRATUM}\n  turns:\n"
            + "".join(f"    - user: 'Question {t} of conversation {i}?'\n" for t in range(turns))
            for i in range(items)
        )
    )
    (experiments / "test_conversations.py").write_text(TEST_MODULE)
    (root / "pyproject.toml").write_text(PYPROJECT)
    (root / "sbatch").mkdir()
    template = Path(pytest_haico.__file__).parent / "templates" / "campaign.sbatch"
    shutil.copy(template, root / "sbatch" / "campaign.sbatch")
