"""The ledger's guarantees where the runner writes the records: a real stack, a real
pytest process (slow: each test starts Postgres and the stand-ins)."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from tests.integration.conftest import Project
from tests.ledger.conftest import Mount, fill

CONVERSATION_TEST = """
from pytest_haico import Verdict


def test_conversation(haico_conversation):
    assert haico_conversation.verdict is Verdict.COMPLETED, haico_conversation.explain()
"""
TOKEN_TEST = """
from pytest_haico import InfraError


def test_conversation(haico_item, haico_stack):
    raise InfraError(f"the backend refused token {haico_stack.admin_token}")
"""


@pytest.fixture
def project(tmp_path: Path) -> Project:
    """An empty campaign project in a tmp dir."""
    return Project(tmp_path / "project")


def quick_scripts(count: int) -> str:
    return "".join(f'{{"id": "q{i}", "turns": [{{"user": "hello {i}"}}]}}\n' for i in range(count))


def test_a_full_ledger_stops_the_runner_with_75_naming_the_file_system(
    project: Project, tmpfs: Mount
) -> None:
    project.write("arms/demo.toml", "[run]\nconcurrency = 2\n")
    project.write("scripts/a.jsonl", quick_scripts(6))
    project.write("test_conversations.py", CONVERSATION_TEST)
    ledger_dir = tmpfs(project.arm_dir("demo") / "ledger")
    filler = fill(ledger_dir)

    full = project.run("--haico-exit", "campaign")
    assert full.returncode == 75, full.stdout
    pytest.LineMatcher(full.stdout.splitlines()).fnmatch_lines(
        [
            f"stopped (exit 75): cannot make a record durable in the ledger {ledger_dir}/"
            f"local-*.1.jsonl: [[]Errno 28[]] No space left on device on the file system "
            f"mounted at {ledger_dir} (tmpfs from tmpfs, device *). Free space on that file "
            "system, or choose another results directory (--haico-results, CLUSTER_WORK), "
            "then rerun the same command: the items without a record run again",
        ]
    )
    assert "circuit breaker" not in full.stdout
    assert project.records("demo") == []

    filler.unlink()
    again = project.run("--haico-exit", "campaign")
    assert again.returncode == 0, again.stdout
    assert "haico: 0 done in ledger, 6 to run (0 retries)" in again.stdout
    assert sorted(r["verdict"] for r in project.records("demo")) == ["completed"] * 6


def test_the_arms_admin_token_never_reaches_the_ledger(project: Project) -> None:
    project.write("arms/demo.toml", "")
    project.write("scripts/a.jsonl", quick_scripts(1))
    project.write("test_conversations.py", TOKEN_TEST)
    result = project.run()
    assert result.returncode == 1, result.stdout
    (record,) = project.records("demo")
    assert record["error"] == {
        "kind": "InfraError",
        "message": "the backend refused token [REDACTED]",
    }


def test_transcripts_get_the_results_mode(project: Project) -> None:
    project.write("arms/demo.toml", "")
    project.write("scripts/a.jsonl", quick_scripts(2))
    project.write("test_conversations.py", CONVERSATION_TEST)
    result = project.run("--haico-results-mode", "0600")
    assert result.returncode == 0, result.stdout
    transcripts = project.arm_dir("demo") / "transcripts"
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in transcripts.iterdir()}
    assert len(modes) == 2
    assert set(modes.values()) == {0o600}
    assert stat.S_IMODE(transcripts.stat().st_mode) == 0o700
