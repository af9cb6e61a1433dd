"""The README's first screen and CI agree: `.ci/run` runs the README's test command as it
stands, set-up included."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _first_screen_commands() -> list[str]:
    """The commands of the README's first shell block, comments left out."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    match = re.search(r"```sh\n(.*?)```", readme, re.DOTALL)
    assert match is not None, "README.md has no ```sh block"
    lines = (line.strip() for line in match.group(1).splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def test_the_first_screen_has_the_main_job_and_the_test_command() -> None:
    main_job, tests = _first_screen_commands()
    assert main_job.endswith(".venv/bin/pytest experiments")
    assert tests.startswith("python3 tests/vllm/setup_tier.py && ")
    assert tests.endswith(".venv/bin/python -m pytest -n 4")


def test_ci_runs_the_readme_test_command_verbatim() -> None:
    _, tests = _first_screen_commands()
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    executed = [line.strip() for line in ci.splitlines() if not line.lstrip().startswith("#")]
    assert tests in executed
