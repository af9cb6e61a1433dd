"""A stop does not wait out a preparation's helper (initdb, cp): it kills it."""

from __future__ import annotations

import re
import threading
from pathlib import Path

import pytest

from pytest_haico.errors import StackError
from pytest_haico.procfs import is_alive
from pytest_haico.stack import HttpService, Orchestrator
from pytest_haico.stack.pgcluster import Helpers, Owner
from tests.stack.stack_helpers import tiny

# A helper with a child of its own, as initdb has its bootstrap postgres: both must go.
_SLEEPER = ["/bin/sh", "-c", 'sleep 600 & echo "sleeper $!"; wait']


def _sleeper_pid(log: Path) -> int | None:
    found = re.search(r"^sleeper (\d+)$", log.read_text(), re.MULTILINE) if log.exists() else None
    return int(found.group(1)) if found else None


def _wait_for_sleeper(log: Path, failed: threading.Event) -> int:
    """The sleeper's pid once the helper has started it (bounded: 60 s)."""
    for _ in range(600):
        pid = _sleeper_pid(log)
        if pid is not None:
            return pid
        if failed.wait(0.1):
            break
    pytest.fail(f"the helper never started: {log.read_text() if log.exists() else 'no log'}")


class _RunsAHelper(HttpService):
    """Prepares by running a long helper as Postgres' would (Owner.run), cancellably."""

    helpers: Helpers
    ended: threading.Event

    def prepare(self, log_path: Path) -> None:
        try:
            Owner.resolve().run(_SLEEPER, log_path, helpers=self.helpers)
        finally:
            self.ended.set()

    def cancel_prepare(self) -> None:
        self.helpers.cancel()


def test_cancel_kills_the_running_helper_and_its_children(tmp_path: Path) -> None:
    log = tmp_path / "helper.log"
    helpers = Helpers()
    errors: list[BaseException] = []
    ended = threading.Event()

    def run() -> None:
        try:
            Owner.resolve().run(_SLEEPER, log, helpers=helpers)
        except BaseException as exc:
            errors.append(exc)
        finally:
            ended.set()

    threading.Thread(target=run, daemon=True).start()
    sleeper = _wait_for_sleeper(log, ended)
    helpers.cancel()
    assert ended.wait(60), "the helper outlived its cancel"
    assert [str(e) for e in errors] == [
        "postgres: preparation cancelled: the stack is stopping (sh killed)"
    ]
    assert not is_alive(sleeper)


def test_a_cancelled_preparation_runs_no_further_helper(tmp_path: Path) -> None:
    helpers = Helpers()
    helpers.cancel()
    with pytest.raises(StackError, match="preparation cancelled"):
        Owner.resolve().run(_SLEEPER, tmp_path / "helper.log", helpers=helpers)
    assert _sleeper_pid(tmp_path / "helper.log") is None


def test_an_interrupted_start_kills_a_preparation_in_progress(tmp_path: Path) -> None:
    slow = _RunsAHelper(name="db", argv=tiny().argv)
    slow.helpers, slow.ended = Helpers(), threading.Event()
    stack = Orchestrator([slow], tmp_path / "logs", state_dir=tmp_path, reap=False)
    errors: list[BaseException] = []
    started = threading.Event()

    def start() -> None:
        try:
            stack.start()
        except BaseException as exc:
            errors.append(exc)
        finally:
            started.set()

    threading.Thread(target=start, daemon=True).start()
    sleeper = _wait_for_sleeper(tmp_path / "logs" / "db.log", started)
    stack.interrupt("SIGTERM")
    # Without the cancel the start would end only at the helper's own 120-s limit.
    assert started.wait(60), "the stopped start waited for its preparation"
    assert [str(e) for e in errors] == ["SIGTERM: the stack was stopped while starting"]
    assert slow.ended.is_set()
    assert not is_alive(sleeper)
    assert list((tmp_path / "ports").glob("*.json")) == []
