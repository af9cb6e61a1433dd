"""This repository's own test session: its plugins and markers, the Hypothesis profile of CI,
the marks that keep the slow tests out of the fast loop, and how `-n N` shares the tests
out among xdist's workers; below them, this repository's implementations of pytest-haico's
hook specs.

pytest loads this file for every run in the repository, `pytest experiments` too: what
concerns the tests applies to the items under tests/ only.
"""

from __future__ import annotations

import ast
import functools
import inspect
import itertools
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
# How a test runs a child process: pytester's and the harness's methods, and the standard
# library's.
SUBPROCESS_METHODS = frozenset(
    {"runpytest_subprocess", "run_subprocess", "run_on_terminal", "start_pytest"}
)
SUBPROCESS_CALLS = frozenset(
    {
        ("subprocess", name)
        for name in ("run", "Popen", "call", "check_call", "check_output", "getoutput")
    }
    | {("asyncio", "create_subprocess_exec"), ("asyncio", "create_subprocess_shell")}
    # The harness's background run (`campaign.start(...)`); `start` alone names too much.
    | {("campaign", "start")}
)
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
    names = set(getattr(item, "fixturenames", ()))
    marks = {mark for fixture, found in FIXTURE_MARKS.items() if fixture in names for mark in found}
    folder = item.path.relative_to(TESTS).parts[0]
    if folder in FOLDER_MARKS:
        marks.add(FOLDER_MARKS[folder])
    marked = {mark.name for mark in item.iter_markers()}  # `vllm` comes with a parameter
    if not (marks | marked) & FINER_MARKS and _runs_a_child_process(item):
        marks.add("subprocess")
    if (marks | marked) & FINER_MARKS:
        marks.add("slow")
    for name in sorted(marks):
        item.add_marker(name)


def _runs_a_child_process(item: pytest.Item) -> bool:
    """Whether the test function, a fixture of its module that it uses, or a function of
    its module that they call, calls one of the `SUBPROCESS_METHODS` or `SUBPROCESS_CALLS`,
    or runs `python -m pytest`."""
    function = getattr(item, "function", None)
    module = inspect.getmodule(function) if function is not None else None
    if function is None or module is None or module.__file__ is None:
        return False
    functions = _functions_of(Path(module.__file__))
    used = [function.__name__, *getattr(item, "fixturenames", ())]
    seen: set[str] = set()
    return any(
        _calls_a_subprocess(functions, name, seen=seen)
        for name in used
        if name in functions and name not in seen
    )


@functools.cache
def _functions_of(path: Path) -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
    """The functions of a module by name, methods included."""
    tree = ast.parse(path.read_text(), str(path))
    kinds = (ast.FunctionDef, ast.AsyncFunctionDef)
    return {node.name: node for node in ast.walk(tree) if isinstance(node, kinds)}


def _calls_a_subprocess(
    functions: dict[str, ast.FunctionDef | ast.AsyncFunctionDef], name: str, *, seen: set[str]
) -> bool:
    """Whether function `name` calls one of `SUBPROCESS_METHODS` or `SUBPROCESS_CALLS`, or runs
    `python -m pytest`, itself or through a function of `functions` that it calls."""
    seen.add(name)
    for node in ast.walk(functions[name]):
        if isinstance(node, ast.Call | ast.List | ast.Tuple) and _names_python_m_pytest(node):
            return True
        if not isinstance(node, ast.Call):
            continue
        called = node.func
        if isinstance(called, ast.Attribute):
            receiver = called.value.id if isinstance(called.value, ast.Name) else None
            if called.attr in SUBPROCESS_METHODS or (receiver, called.attr) in SUBPROCESS_CALLS:
                return True
        elif isinstance(called, ast.Name):
            if called.id in SUBPROCESS_METHODS:
                return True
            if (
                called.id in functions
                and called.id not in seen
                and _calls_a_subprocess(functions, called.id, seen=seen)
            ):
                return True
    return False


def _names_python_m_pytest(node: ast.Call | ast.List | ast.Tuple) -> bool:
    """Whether a call's arguments, or a list's items, hold "-m", "pytest" in a row."""
    values = node.args if isinstance(node, ast.Call) else node.elts
    words = [value.value if isinstance(value, ast.Constant) else None for value in values]
    return any(pair == ("-m", "pytest") for pair in itertools.pairwise(words))


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
