"""The ledger's guarantees where the runner writes the records: a real stack, a real
pytest process (slow: each test starts Postgres and the stand-ins)."""

from __future__ import annotations

import stat

import pytest

from tests.harness import CONVERSATION_MODULE, CampaignProject
from tests.ledger.conftest import Mount, fill

# Each test runs a child process (the fast loop, `-m "not slow"`, leaves them out).
pytestmark = pytest.mark.subprocess

TOKEN_TEST = """
from pytest_haico import InfraError


def test_conversation(haico_item, haico_stack):
    raise InfraError(f"the backend refused token {haico_stack.admin_token}")
"""


def quick_scripts(count: int) -> str:
    return "".join(f'{{"id": "q{i}", "turns": [{{"user": "hello {i}"}}]}}\n' for i in range(count))


def test_a_full_ledger_stops_the_runner_with_75_naming_the_file_system(
    campaign: CampaignProject, tmpfs: Mount
) -> None:
    campaign.arm("demo", "[run]\nconcurrency = 2\n")
    campaign.scripts("a.jsonl", quick_scripts(6))
    campaign.write("test_conversations.py", CONVERSATION_MODULE)
    ledger_dir = tmpfs(campaign.arm_dir("demo") / "ledger")
    filler = fill(ledger_dir)

    full = campaign.run_subprocess("--haico-exit", "campaign")
    assert full.ret == 75, full.stdout.str()
    full.stdout.fnmatch_lines(
        [
            f"stopped (exit 75): cannot make a record durable in the ledger {ledger_dir}/"
            f"local-*.1.jsonl: [[]Errno 28[]] No space left on device on the file system "
            f"mounted at {ledger_dir} (tmpfs from tmpfs, device *). Free space on that file "
            "system, or choose another results directory (--haico-results, CLUSTER_WORK), "
            "then rerun the same command: the items not done run again",
        ]
    )
    assert "circuit breaker" not in full.stdout.str()
    assert campaign.records("demo") == []

    filler.unlink()
    again = campaign.run_subprocess("--haico-exit", "campaign")
    assert again.ret == 0, again.stdout.str()
    assert "haico: 0 done in ledger, 6 to run (0 retries)" in again.stdout.str()
    assert sorted(r["verdict"] for r in campaign.records("demo")) == ["completed"] * 6


def test_a_full_transcripts_file_system_stops_the_run_with_one_line_and_75(
    campaign: CampaignProject, tmpfs: Mount
) -> None:
    campaign.arm("demo", "[run]\nconcurrency = 1\n")
    campaign.scripts("a.jsonl", quick_scripts(6))
    campaign.write("test_conversations.py", CONVERSATION_MODULE)
    transcripts = tmpfs(campaign.arm_dir("demo") / "transcripts")
    filler = fill(transcripts)

    full = campaign.run_subprocess("--haico-exit", "campaign")
    assert full.ret == 75, full.stdout.str()
    full.stdout.fnmatch_lines(
        [
            f"stopped (exit 75): cannot write the transcript {transcripts}/*.jsonl: "
            f"[[]Errno 28[]] No space left on device on the file system mounted at "
            f"{transcripts} (tmpfs from tmpfs, device *). Free space on that file system, or "
            "choose another results directory (--haico-results, CLUSTER_WORK), then rerun the "
            "same command: the items not done run again",
        ]
    )
    output = full.stdout.str()
    assert "circuit breaker" not in output and "Traceback" not in output
    assert "E   OSError" not in output
    # The first conversation's record is kept (infra_error: it runs again); none followed.
    records = campaign.records("demo")
    assert [r["verdict"] for r in records] == ["infra_error"]
    assert records[0]["error"]["kind"] == "transcript"

    filler.unlink()
    again = campaign.run_subprocess("--haico-exit", "campaign")
    assert again.ret == 0, again.stdout.str()
    assert sorted(r["verdict"] for r in campaign.records("demo")) == (
        ["completed"] * 6 + ["infra_error"]
    )


def test_a_disk_that_fills_as_the_stack_starts_exits_78_naming_the_file_system_once(
    campaign: CampaignProject, tmpfs: Mount
) -> None:
    campaign.arm("demo")
    campaign.scripts("a.jsonl", quick_scripts(2))
    campaign.write("test_conversations.py", CONVERSATION_MODULE)
    # Four pages: the run's claim, gates and registry fit, the services' logs do not.
    runs = tmpfs(campaign.arm_dir("demo") / "runs", size="16k")

    full = campaign.run_subprocess("--haico-exit", "campaign")
    # A stack that cannot start, as any other (a resubmission would meet the same disk).
    assert full.ret == 78, full.stdout.str()
    output = full.stdout.str()
    full.stdout.fnmatch_lines(
        [
            f"stack failed (exit 78): the stack of arm demo did not start: cannot write the * log "
            f"{runs}/*/logs/*.log: [[]Errno 28[]] No space left on device on the file system "
            f"mounted at {runs} (tmpfs from tmpfs, device *). Free space on that file system, "
            "or choose another results directory (--haico-results, CLUSTER_WORK), then rerun "
            "the same command: the items not done run again",
        ]
    )
    assert output.count("Free space on that file system") == 1  # the rest say where it is
    assert "(where and the fix: the haico summary)" in output
    assert output.count("not updated") <= 1 and "Traceback" not in output
    assert campaign.records("demo") == []


def test_the_arms_admin_token_never_reaches_the_ledger(campaign: CampaignProject) -> None:
    campaign.arm("demo")
    campaign.scripts("a.jsonl", quick_scripts(1))
    campaign.write("test_conversations.py", TOKEN_TEST)
    result = campaign.run_subprocess()
    assert result.ret == 1, result.stdout.str()
    (record,) = campaign.records("demo")
    assert record["error"] == {
        "kind": "InfraError",
        "message": "the backend refused token [REDACTED]",
    }


def test_transcripts_get_the_results_mode(campaign: CampaignProject) -> None:
    campaign.arm("demo")
    campaign.scripts("a.jsonl", quick_scripts(2))
    campaign.write("test_conversations.py", CONVERSATION_MODULE)
    result = campaign.run_subprocess("--haico-results-mode", "0600")
    assert result.ret == 0, result.stdout.str()
    transcripts = campaign.arm_dir("demo") / "transcripts"
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in transcripts.iterdir()}
    assert len(modes) == 2
    assert set(modes.values()) == {0o600}
    assert stat.S_IMODE(transcripts.stat().st_mode) == 0o700


# A conftest that fills the file system of `filler` as the first item sets up: after the
# run's claim and gates.json, before its stack starts.
FILL_AT_FIRST_SETUP = """
import errno

import pytest


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    with open({filler!r}, "ab", buffering=0) as handle:
        for _ in range(1 << 20):
            try:
                handle.write(bytes(4096))
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
                return
"""


def test_a_disk_full_at_the_runs_timeline_exits_78_with_one_line_and_keeps_the_records(
    campaign: CampaignProject, tmpfs: Mount
) -> None:
    campaign.arm("demo")
    campaign.scripts("a.jsonl", quick_scripts(2))
    campaign.write("test_conversations.py", CONVERSATION_MODULE)
    runs = tmpfs(campaign.arm_dir("demo") / "runs", size="4m")
    first = campaign.run_subprocess("--haico-exit", "campaign", "-k", "q0")
    assert first.ret == 0, first.stdout.str()
    campaign.write("conftest.py", FILL_AT_FIRST_SETUP.format(filler=str(runs / "filler.bin")))

    full = campaign.run_subprocess("--haico-exit", "campaign")
    assert full.ret == 78, full.stdout.str()
    full.stdout.fnmatch_lines(
        [
            "stack failed (exit 78): the stack of arm demo did not start: cannot write the "
            f"run's timeline {runs}/*/timeline.json: [[]Errno 28[]] No space left on device on "
            f"the file system mounted at {runs} (tmpfs from tmpfs, device *). Free space on "
            "that file system, or choose another results directory (--haico-results, "
            "CLUSTER_WORK), then rerun the same command: the items not done run again",
        ]
    )
    output = full.stdout.str()
    assert output.count("Free space on that file system") == 1  # the rest say where it is
    assert "Traceback" not in output and "E   OSError" not in output
    assert [(r["script"], r["verdict"]) for r in campaign.records("demo")] == [("q0", "completed")]
