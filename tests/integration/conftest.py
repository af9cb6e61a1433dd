"""A campaign project on disk, run by a real pytest process, and what it left behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


class Project:
    """An experiments directory with one or more arms; runs pytest on it as a subprocess."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.experiments = root / "experiments"
        (self.experiments / "arms").mkdir(parents=True)
        (self.experiments / "scripts").mkdir()
        (root / "pyproject.toml").write_text(
            '[tool.pytest.ini_options]\nasyncio_default_fixture_loop_scope = "function"\n'
        )

    def write(self, relative: str, text: str) -> Path:
        path = self.experiments / relative
        path.write_text(textwrap.dedent(text))
        return path

    def command(self, *args: str) -> list[str]:
        """pytest on `experiments`, or on the paths among `args` when there are any."""
        paths = [] if any(a.startswith("experiments/") for a in args) else ["experiments"]
        return [sys.executable, "-u", "-m", "pytest", *paths, "-p", "no:cacheprovider", *args]

    def run(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.command(*args), cwd=self.root, capture_output=True, text=True, timeout=timeout
        )

    def start(self, *args: str, output: Path) -> subprocess.Popen[bytes]:
        with open(output, "wb") as out:
            return subprocess.Popen(
                self.command(*args), cwd=self.root, stdout=out, stderr=subprocess.STDOUT
            )

    def arm_dir(self, arm: str) -> Path:
        return self.root / "results" / "default" / arm

    def records(self, arm: str) -> list[dict[str, Any]]:
        return [
            json.loads(line)
            for path in sorted((self.arm_dir(arm) / "ledger").glob("*.jsonl"))
            for line in path.read_text().splitlines()
            if line.strip()
        ]


def wait_for(condition: Callable[[], bool], *, timeout: float, what: str) -> None:
    """Poll until `condition` holds; fail naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


def is_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purposes; its parent just has not reaped it yet.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (OSError, IndexError):
        return False


@pytest.fixture
def project(tmp_path: Path) -> Project:
    """An empty campaign project in a tmp dir."""
    return Project(tmp_path / "project")
