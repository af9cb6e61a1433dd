"""A campaign that must stop now: Ctrl-C, a service that dies, a stack that cannot start."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import Project, wait_for

CONVERSATION_TEST = """
from pytest_haico import Verdict


def test_conversation(haico_conversation):
    assert haico_conversation.verdict is Verdict.COMPLETED, haico_conversation.explain()
"""
# --haico-drain-timeout's default: the grace the old Ctrl-C path waited in full.
DRAIN_TIMEOUT_S = 120.0
# Far beyond any bound below: a turn that waits for it cannot pass these tests.
TURN_TIMEOUT_S = 600


def scripts(count: int, *, turns: int = 1) -> str:
    lines = []
    for i in range(count):
        talk = ", ".join(f'{{"user": "turn {t} of talk {i}"}}' for t in range(turns))
        lines.append(f'{{"id": "s{i}", "turns": [{talk}]}}\n')
    return "".join(lines)


def transcripts(project: Project, arm: str) -> int:
    directory = project.arm_dir(arm) / "transcripts"
    return len(list(directory.iterdir())) if directory.is_dir() else 0


def service_pid(project: Project, arm: str, name: str) -> int | None:
    runs = project.arm_dir(arm) / "runs"
    for path in runs.glob("*/services.json") if runs.is_dir() else ():
        try:
            services = json.loads(path.read_text())["services"]
        except (OSError, ValueError, KeyError):
            continue  # being rewritten
        for service in services:
            if service["name"] == name and service.get("pid"):
                return int(service["pid"])
    return None


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    """pytest processes a test starts; killed at teardown if a failed test left them running."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=60)


def test_ctrl_c_records_in_flight_items_interrupted_at_once_and_exits_75(
    project: Project, tmp_path: Path, processes: list[subprocess.Popen[bytes]]
) -> None:
    project.write(
        "arms/demo.toml",
        f"[run]\nconcurrency = 3\nturn_timeout_s = {TURN_TIMEOUT_S}\n[standin]\npersona = 'hang'\n",
    )
    project.write("scripts/a.jsonl", scripts(6))
    project.write("test_conversations.py", CONVERSATION_TEST)
    output = tmp_path / "out"
    process = project.start("--haico-exit", "campaign", output=output)
    processes.append(process)
    wait_for(lambda: transcripts(project, "demo") >= 3, timeout=120, what="3 conversations")

    signalled = time.monotonic()
    process.send_signal(signal.SIGINT)
    code = process.wait(timeout=DRAIN_TIMEOUT_S + 60)
    elapsed = time.monotonic() - signalled

    text = output.read_text()
    assert code == 75, text
    # No drain: the old code waited the whole default grace for the hung turns.
    assert elapsed < DRAIN_TIMEOUT_S, text
    records = project.records("demo")
    assert len(records) == 3
    assert {r["verdict"] for r in records} == {"interrupted"}
    pytest.LineMatcher(text.splitlines()).fnmatch_lines(
        [
            "*= haico =*",
            "demo: 3 item(s) in * s (stack included): 3 interrupted",
            "  3 of them are not in pytest's counts: the session stopped before they were reported",
        ]
    )
    rerun = project.run("--collect-only", "-q")
    pytest.LineMatcher(rerun.stdout.splitlines()).fnmatch_lines(
        ["haico: 0 done in ledger, 6 to run (0 retries, 3 resumed after interruption)"]
    )


def test_a_killed_postgres_ends_the_run_at_once_and_names_it(
    project: Project, tmp_path: Path, processes: list[subprocess.Popen[bytes]]
) -> None:
    project.write(
        "arms/demo.toml",
        f"[run]\nconcurrency = 3\nturn_timeout_s = {TURN_TIMEOUT_S}\n[standin]\npersona = 'slow'\n",
    )
    # Long talks, so that the kill lands mid-conversation.
    project.write("scripts/a.jsonl", scripts(6, turns=20))
    project.write("test_conversations.py", CONVERSATION_TEST)
    output = tmp_path / "out"
    process = project.start("--haico-exit", "campaign", output=output)
    processes.append(process)
    wait_for(lambda: transcripts(project, "demo") >= 3, timeout=120, what="3 conversations")
    postgres = service_pid(project, "demo", "postgres")
    assert postgres is not None

    killed = time.monotonic()
    os.kill(postgres, signal.SIGKILL)
    code = process.wait(timeout=TURN_TIMEOUT_S / 5)
    elapsed = time.monotonic() - killed

    text = output.read_text()
    assert code == 75, text
    assert elapsed < TURN_TIMEOUT_S / 10, text
    records = project.records("demo")
    assert len(records) == 3, records
    for record in records:
        assert record["verdict"] == "infra_error"
        assert record["error"]["kind"] == "service_died"
        assert record["error"]["message"].startswith(
            f"postgres (pid {postgres}) was killed by SIGKILL while conversations were in flight;"
        )
        assert "last lines of" in record["error"]["message"]
    pytest.LineMatcher(text.splitlines()).fnmatch_lines(
        [
            "*= haico =*",
            f"stopped (exit 75): postgres (pid {postgres}) was killed by SIGKILL while "
            "conversations were in flight; last lines of */logs/postgres.log:",
            "*",
            "demo: 3 item(s) in * s (stack included): 3 infra_error",
            "  2 of them are not in pytest's counts: the session stopped before they were reported",
            f"*Interrupted: haico: postgres (pid {postgres}) was killed by SIGKILL while "
            "conversations were in flight !*",
        ]
    )


REFUSED_SNAPSHOTS = """
from psycopg.conninfo import make_conninfo

import pytest_haico.runner.arm_run as arm_run

_connect = arm_run.PostgresSnapshotReader.connect


async def _wrong_password(dsn):
    # The real server refuses the harness's read-only login, as a broken pg_hba.conf would.
    return await _connect(make_conninfo(dsn, password="not-the-password"))


arm_run.PostgresSnapshotReader.connect = staticmethod(_wrong_password)
"""


def test_a_refused_snapshot_connection_fails_the_arm_once_and_exits_78(project: Project) -> None:
    project.write("arms/demo.toml", "")
    project.write("scripts/a.jsonl", scripts(3))
    project.write("test_conversations.py", CONVERSATION_TEST)
    project.write("conftest.py", REFUSED_SNAPSHOTS)
    result = project.run("--haico-exit", "campaign", "-v")
    assert result.returncode == 78, result.stdout + result.stderr
    pytest.LineMatcher(result.stdout.splitlines()).fnmatch_lines(
        [
            "*= haico =*",
            "stack failed (exit 78): the stack of arm demo did not start: the snapshot "
            "connection to postgres failed: OperationalError: *password authentication failed*",
        ]
    )
    assert "gate" not in result.stdout.lower()
    assert not re.search(r"haico_readonly:[^@\s]+@", result.stdout), "a password was shown"
    assert project.records("demo") == []
    logs = next((project.arm_dir("demo") / "runs").iterdir()) / "logs"
    ready = "database system is ready to accept connections"
    assert (logs / "postgres.log").read_text().count(ready) == 1, "started once, not per item"


SKIPPING_CONFTEST = """
import pytest


def pytest_collection_modifyitems(items):
    marks = {
        "s0": pytest.mark.skip(reason="not today"),
        "s1": pytest.mark.skipif(True, reason="a true condition"),
        "s2": pytest.mark.skipif("sys.platform != 'no-such-platform'", reason="as a string"),
        "s3": pytest.mark.xfail(run=False, reason="known to hang"),
        "s4": pytest.mark.skipif(False, reason="a false condition"),
    }
    for item in items:
        for script, mark in marks.items():
            if f"-{script}-" in item.nodeid:
                item.add_marker(mark)
"""


def test_items_skipped_by_marks_run_no_conversation_and_leave_no_record(
    project: Project,
) -> None:
    project.write("arms/demo.toml", "")
    project.write("scripts/a.jsonl", scripts(6))
    project.write("test_conversations.py", CONVERSATION_TEST)
    project.write("conftest.py", SKIPPING_CONFTEST)
    result = project.run("-rsx")
    assert result.returncode == 0, result.stdout
    pytest.LineMatcher(result.stdout.splitlines()).fnmatch_lines(
        [
            "haico: 0 done in ledger, 2 to run (0 retries); 4 skipped by marks",
            "*2 passed, 3 skipped, 1 xfailed*",
        ]
    )
    assert sorted(r["script"] for r in project.records("demo")) == ["s4", "s5"]
    assert transcripts(project, "demo") == 2


def _as_a_batch_shell_starts_it() -> None:
    """A non-interactive shell's background job: SIGINT (and SIGQUIT) inherited ignored."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["INT", "TERM"])
def test_int_or_term_to_a_pytest_started_in_the_background_records_interrupted_and_exits_75(
    project: Project, tmp_path: Path, processes: list[subprocess.Popen[bytes]], signum: int
) -> None:
    project.write(
        "arms/demo.toml",
        f"[run]\nconcurrency = 2\nturn_timeout_s = {TURN_TIMEOUT_S}\n[standin]\npersona = 'hang'\n",
    )
    project.write("scripts/a.jsonl", scripts(4))
    project.write("test_conversations.py", CONVERSATION_TEST)
    output = tmp_path / "out"
    with open(output, "wb") as out:
        process = subprocess.Popen(
            project.command("--haico-exit", "campaign"),
            cwd=project.root,
            stdout=out,
            stderr=subprocess.STDOUT,
            preexec_fn=_as_a_batch_shell_starts_it,
        )
    processes.append(process)
    wait_for(lambda: transcripts(project, "demo") >= 2, timeout=120, what="2 conversations")

    process.send_signal(signum)
    code = process.wait(timeout=DRAIN_TIMEOUT_S)

    text = output.read_text()
    assert code == 75, text
    records = project.records("demo")
    assert [r["verdict"] for r in records] == ["interrupted", "interrupted"], text
    assert "Traceback" not in text
