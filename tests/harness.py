"""A campaign project for pytester, run by pytest in-process, in a subprocess or in the
background, and readers for what its runs left in results/."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import textwrap
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.polling import wait_for

# The campaign's default test module: what each item does is driven by its first turn's
# text, so a test can mix passing, failing and infra-failing items in one campaign, and
# no stack is started.
ITEM_MODULE = """
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

# The test module a user writes: every item holds a real conversation with the stack.
CONVERSATION_MODULE = """
from pytest_haico import Verdict


def test_conversation(haico_conversation):
    assert haico_conversation.verdict is Verdict.COMPLETED, haico_conversation.explain()
"""

# langsmith (pulled in by the stand-ins' LangChain) costs 0.7 s per pytest start; no
# campaign here uses it.
PYPROJECT = """\
[tool.pytest.ini_options]
addopts = ["-p", "no:langsmith_plugin"]
asyncio_default_fixture_loop_scope = "function"
"""

# What a shell inside a Slurm job (or a developer's environment) would hand the runs.
_SLURM_VARIABLES = (
    "SLURM_JOB_ID",
    "SLURM_ARRAY_JOB_ID",
    "SLURM_ARRAY_TASK_ID",
    "SLURM_RESTART_COUNT",
    "CLUSTER_WORK",
)


def clear_campaign_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Unset the Slurm job variables, CLUSTER_WORK and every PYTEST_HAICO_* variable."""
    for name in _SLURM_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    for name in list(os.environ):
        if name.startswith("PYTEST_HAICO_"):
            monkeypatch.delenv(name)


@dataclass
class BackgroundRun:
    """A pytest process started in the background; its stdout and stderr go to `log`."""

    process: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def output(self) -> str:
        """Everything the run printed so far (it runs unbuffered)."""
        return self.log.read_text()

    def send_signal(self, signum: int) -> None:
        self.process.send_signal(signum)

    def wait(self, timeout: float) -> int:
        """Its exit status; a negative number is the signal that killed it."""
        return self.process.wait(timeout=timeout)

    def wait_for(self, condition: Callable[[], bool], *, timeout: float, what: str) -> None:
        """`polling.wait_for`, failing at once with the run's output if the run ends first."""

        def holds_while_running() -> bool:
            if condition():
                return True
            if self.process.poll() is None:
                return False
            if condition():  # it got there just before it ended
                return True
            pytest.fail(
                f"the pytest run ended (exit {self.process.returncode}) before {what}:\n"
                f"{self.output()}"
            )

        wait_for(holds_while_running, timeout=timeout, what=what)

    def stop(self) -> None:
        """Kill the run if it still runs (teardown of a test that failed half-way)."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=60)


def start_pytest(
    pytester: pytest.Pytester,
    *args: str,
    log: Path,
    env: Mapping[str, str] | None = None,
    preexec_fn: Callable[[], None] | None = None,
) -> BackgroundRun:
    """Start `python -u -m pytest *args` in `pytester.path` (its output unbuffered in `log`),
    with `env` added to the environment it inherits; `preexec_fn` runs in the child."""
    command = [sys.executable, "-u", "-m", "pytest", *args]
    # pytester.popen passes a copy of os.environ, so extra variables go there, briefly.
    with pytest.MonkeyPatch.context() as patch, open(log, "w") as out:
        for name, value in (env or {}).items():
            patch.setenv(name, value)
        process = pytester.popen(
            command, stdout=out, stderr=subprocess.STDOUT, preexec_fn=preexec_fn
        )
    return BackgroundRun(process, log)


class CampaignProject:
    """An experiments directory under `pytester.path` (with the `ITEM_MODULE` test module),
    run by pytest, and what the runs left in results/.

    Runs are on `experiments`, or on the paths among their arguments when some name a
    path under it, always with `-p no:cacheprovider`.
    """

    def __init__(self, pytester: pytest.Pytester) -> None:
        self.pytester = pytester
        self.root = pytester.path
        self.experiments = self.root / "experiments"
        self._background: list[BackgroundRun] = []
        (self.experiments / "arms").mkdir(parents=True)
        (self.experiments / "scripts").mkdir()
        self.write("test_conversations.py", ITEM_MODULE)
        pytester.makepyprojecttoml(PYPROJECT)

    # -- writing the experiments -------------------------------------------------------

    def write(self, relative: str, text: str) -> Path:
        """Write `experiments/<relative>` (a test module, a conftest.py, cluster.env...)."""
        path = self.experiments / relative
        path.write_text(textwrap.dedent(text))
        return path

    def arm(self, name: str, text: str = "") -> Path:
        """`arms/<name>.toml`: `text`, else the smallest valid arm (defaults for the rest)."""
        return self.write(f"arms/{name}.toml", text or f'description = "test arm {name}"\n')

    def scripts(self, filename: str, text: str) -> Path:
        return self.write(f"scripts/{filename}", text)

    def simple_scripts(self, *ids: str, stratum: str = "default", text: str = "hello") -> Path:
        """One single-turn script per id, `<text> <id>`, in `scripts/<first id>.jsonl`."""
        docs = [
            {"id": sid, "stratum": stratum, "turns": [{"user": f"{text} {sid}"}]} for sid in ids
        ]
        return self.scripts(f"{ids[0]}.jsonl", "\n".join(json.dumps(d) for d in docs) + "\n")

    # -- running it ----------------------------------------------------------------------

    def _args(self, args: tuple[str, ...]) -> list[str]:
        paths = [] if any(a.startswith("experiments/") for a in args) else ["experiments"]
        return [*paths, "-p", "no:cacheprovider", *args]

    def run(self, *args: str) -> pytest.RunResult:
        """Run pytest in this process (the default: no stack, no real signal)."""
        return self.pytester.runpytest(*self._args(args))

    def run_subprocess(self, *args: str, timeout: float = 300) -> pytest.RunResult:
        """Run pytest in a subprocess: for a real stack, a real interrupt, or a run that
        might block."""
        return self.pytester.runpytest_subprocess(*self._args(args), timeout=timeout)

    def run_on_terminal(self, *args: str, timeout: float = 120) -> tuple[int, str]:
        """Run pytest in a subprocess whose stdin, stdout and stderr are a pseudo-terminal
        (what a user at a terminal has); its exit status and its output, newlines as "\\n"."""
        master, slave = os.openpty()
        try:
            process = self.pytester.popen(
                [sys.executable, "-m", "pytest", *self._args(args)],
                stdin=slave,
                stdout=slave,
                stderr=slave,
            )
        finally:
            os.close(slave)
        chunks: list[bytes] = []
        try:
            while True:
                ready, _, _ = select.select([master], [], [], timeout)
                if not ready:
                    process.kill()
                    pytest.fail(f"pytest on a terminal printed nothing for {timeout} s")
                try:
                    data = os.read(master, 65536)
                except OSError:  # EIO: the child's side is closed, everything was read
                    break
                if not data:
                    break
                chunks.append(data)
            status = process.wait(timeout=timeout)
        finally:
            os.close(master)
        return status, b"".join(chunks).decode(errors="replace").replace("\r\n", "\n")

    def start(
        self,
        *args: str,
        env: Mapping[str, str] | None = None,
        preexec_fn: Callable[[], None] | None = None,
    ) -> BackgroundRun:
        """Start pytest in the background, for a test to signal or kill; runs still going
        at teardown are killed. `env` is added to the environment of this run alone."""
        log = self.root / f"background-{len(self._background)}.out"
        run = start_pytest(
            self.pytester, *self._args(args), log=log, env=env, preexec_fn=preexec_fn
        )
        self._background.append(run)
        return run

    def stop_background_runs(self) -> None:
        for run in self._background:
            run.stop()

    # -- reading the results ---------------------------------------------------------------

    def arm_dir(self, arm: str, campaign: str = "default") -> Path:
        return self.root / "results" / campaign / arm

    def ledger_files(self, arm: str, campaign: str = "default") -> list[Path]:
        return sorted((self.arm_dir(arm, campaign) / "ledger").glob("*.jsonl"))

    def ledger_lines(self, arm: str, campaign: str = "default") -> list[bytes]:
        """The complete lines of the arm's ledgers: a run that is still going, or was killed,
        may have left a torn last line."""
        lines: list[bytes] = []
        for path in self.ledger_files(arm, campaign):
            lines.extend(path.read_bytes().split(b"\n")[:-1])
        return [line for line in lines if line.strip()]

    def records(self, arm: str, campaign: str = "default") -> list[dict[str, Any]]:
        """Every record of the arm's ledgers (of finished runs), in file order."""
        return [
            json.loads(line)
            for path in self.ledger_files(arm, campaign)
            for line in path.read_text().splitlines()
            if line.strip()
        ]
