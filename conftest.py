"""This repository's own test session: its plugins and markers, the Hypothesis profile of CI,
the marks that keep the slow tests out of the fast loop, and how `-n N` shares the tests
out among xdist's workers; below them, this repository's implementations of pytest-haico's
hook specs.

pytest loads this file for every run in the repository, `pytest experiments` too: what
concerns the tests applies to the items under tests/ only.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pytest_haico.driver.judging import JudgedTurn, JudgeVerdict
    from pytest_haico.serve.resolver import ServedModel

pytest_plugins = ["pytester"]

TESTS = Path(__file__).parent / "tests"

MARKERS = (
    "slow: starts real processes (a stack, Slurm, a pytest run); "
    '`pytest -m "not slow"` is the fast loop',
    "stack: starts real services (Postgres, the stand-ins, a profile's stack); implies slow",
    "slurm: needs real Slurm daemons (skipped with a reason where Slurm is absent); implies slow",
    "subprocess: runs a child process (pytest, a batch script, the haico command); implies slow",
    "postgres: needs a real PostgreSQL server binary",
    "vllm: needs the real-vLLM tier (python3 tests/vllm/setup_tier.py; skipped with a reason "
    "where absent); implies slow",
)

# The session fixtures that start real services (postgres_dsn, llm_server and
# backend_server depend on them, so a test asking for one has them in its closure).
FIXTURE_MARKS = {
    "slurm_cluster": ("slurm",),
    "slurm_nodes": ("slurm",),
    "broken_cluster": ("slurm",),
    "postgres_service": ("stack", "postgres"),
    "standin_launcher": ("stack",),
}
# The folders of tests/ whose tests are there to start real processes and stacks.
FOLDER_MARKS = {
    "slurm": "slurm",
    "stack": "stack",
    "cluster": "stack",
    "kept": "stack",
    "signals": "stack",
    "integration": "stack",
    "vllm": "stack",
}
# The marks that make a test slow. `subprocess` is written on the test that runs a child
# process (`@pytest.mark.subprocess`, or `pytestmark` where every test of a module does).
FINER_MARKS = frozenset({"stack", "slurm", "subprocess", "vllm"})


def pytest_configure(config: pytest.Config) -> None:
    for line in MARKERS:
        config.addinivalue_line("markers", line)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """`-n N` (whose --dist is load unless one is given): whole modules, and the folders
    that share a session resource, see tests/scheduling.py."""
    if config.getoption("dist") != "load":
        return None
    from tests.scheduling import SharedResourceScheduling

    return SharedResourceScheduling(config, log)


# Before -m deselects.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.is_relative_to(TESTS):
            _mark(item)
    if hasattr(config, "workerinput"):
        # Every worker sorts alike (xdist checks that they collected the same order).
        items.sort(key=_hand_out_rank)


def _hand_out_rank(item: pytest.Item) -> int:
    """The longest units go out first, so that the last ones handed out are short: the
    real-vLLM tier (one unit, six minutes of it), then the Slurm modules, then the other
    slow ones."""
    if item.path.is_relative_to(TESTS / "vllm"):
        return 0
    if item.get_closest_marker("slurm"):
        return 1
    return 2 if item.get_closest_marker("slow") else 3


def _mark(item: pytest.Item) -> None:
    """Mark `item` by its folder and the fixtures it uses, and slow when any of its marks,
    these or its own, is one of `FINER_MARKS`."""
    names = set(getattr(item, "fixturenames", ()))
    marks = {mark for fixture, found in FIXTURE_MARKS.items() if fixture in names for mark in found}
    folder = item.path.relative_to(TESTS).parts[0]
    if folder in FOLDER_MARKS:
        marks.add(FOLDER_MARKS[folder])
    marked = {mark.name for mark in item.iter_markers()}  # `vllm` comes with a parameter
    if (marks | marked) & FINER_MARKS:
        marks.add("slow")
    for name in sorted(marks):
        item.add_marker(name)


# Hypothesis's profile for CI (.ci/run sets CI, as most CI services do): the same examples
# on every run, the blob to reproduce a failure, and no deadline, since a loaded machine is
# slow, not wrong. Outside CI, hypothesis is imported only by the tests that use it.
if "CI" in os.environ:
    from hypothesis import HealthCheck, settings

    settings.register_profile(
        "ci",
        derandomize=True,
        print_blob=True,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    settings.load_profile("ci")


# -- this repository's implementations of pytest-haico's hook specs (pytest_haico_*) --------
#
# A judge question this repository answers by counting, without a model: "Is the answer under
# N words?" (`expect: {judge: ...}` in a script). Any other question is left (None) to the
# next implementation, in the end pytest-haico's own, which asks the served judge model.

UNDER_N_WORDS = re.compile(r"Is the answer under (\d+) words\?")


def pytest_haico_judge_turn(turn: JudgedTurn, judge: ServedModel) -> JudgeVerdict | None:
    asked = UNDER_N_WORDS.fullmatch(turn.question.strip())
    if asked is None:
        return None
    from pytest_haico.driver.judging import JudgeVerdict  # only when a judge is asked

    words = len(turn.answer.split())
    answer = f"{'Yes' if words < int(asked[1]) else 'No'}: {words} words (conftest.py counted)"
    return JudgeVerdict(passed=words < int(asked[1]), answer=answer)
