"""A campaign that must stop now: Ctrl-C, a service that dies, a stack that cannot start."""

from __future__ import annotations

import json
import os
import re
import signal
import sys

import pytest

from tests.harness import CONVERSATION_MODULE, CampaignProject

# The grace the old Ctrl-C path waited in full (--haico-drain-timeout): far beyond the
# bounded waits below, so a run that waits for it cannot pass.
DRAIN_TIMEOUT_S = 3600
# How long a run that stops at once is waited for.
STOP_WAIT_S = 120
# Far beyond any bound below: a turn that waits for it cannot pass these tests.
TURN_TIMEOUT_S = 600


# A first turn that makes the model call a tool: persona hang answers it, then holds the
# turn's next request (the tool's result going back), so the conversation stays in flight.
HANGING_TURN = "Write it up as a document"


def scripts(count: int, *, turns: int = 1, text: str = "turn") -> str:
    lines = []
    for i in range(count):
        talk = ", ".join(f'{{"user": "{text} {t} of talk {i}"}}' for t in range(turns))
        lines.append(f'{{"id": "s{i}", "turns": [{talk}]}}\n')
    return "".join(lines)


def transcripts(campaign: CampaignProject, arm: str) -> int:
    directory = campaign.arm_dir(arm) / "transcripts"
    return len(list(directory.iterdir())) if directory.is_dir() else 0


def service_pid(campaign: CampaignProject, arm: str, name: str) -> int | None:
    runs = campaign.arm_dir(arm) / "runs"
    for path in runs.glob("*/services.json") if runs.is_dir() else ():
        try:
            services = json.loads(path.read_text())["services"]
        except (OSError, ValueError, KeyError):
            continue  # being rewritten
        for service in services:
            if service["name"] == name and service.get("pid"):
                return int(service["pid"])
    return None


def test_ctrl_c_records_in_flight_items_interrupted_at_once_and_exits_75(
    campaign: CampaignProject,
) -> None:
    campaign.arm(
        "demo",
        f"[run]\nconcurrency = 3\nturn_timeout_s = {TURN_TIMEOUT_S}\n[standin]\npersona = 'hang'\n",
    )
    campaign.scripts("a.jsonl", scripts(6, text=HANGING_TURN))
    campaign.write("test_conversations.py", CONVERSATION_MODULE)
    process = campaign.start(
        "--haico-exit", "campaign", "--haico-drain-timeout", str(DRAIN_TIMEOUT_S)
    )
    process.wait_for(
        lambda: transcripts(campaign, "demo") >= 3, timeout=120, what="3 conversations"
    )

    process.send_signal(signal.SIGINT)
    # No drain: the old code waited the whole grace for the hung turns.
    code = process.wait(timeout=STOP_WAIT_S)

    text = process.output()
    assert code == 75, text
    records = campaign.records("demo")
    assert len(records) == 3
    assert {r["verdict"] for r in records} == {"interrupted"}
    pytest.LineMatcher(text.splitlines()).fnmatch_lines(
        [
            "*= haico =*",
            "demo: 3 item(s) in * s (stack included): 3 interrupted",
            "  3 of them are not in pytest's counts: the session stopped before they were reported",
        ]
    )
    rerun = campaign.run("--collect-only", "-q")
    rerun.stdout.fnmatch_lines(
        ["haico: 0 done in ledger, 6 to run (0 retries, 3 resumed after interruption)"]
    )


def test_a_killed_postgres_ends_the_run_at_once_and_names_it(
    campaign: CampaignProject,
) -> None:
    campaign.arm(
        "demo",
        f"[run]\nconcurrency = 3\nturn_timeout_s = {TURN_TIMEOUT_S}\n[standin]\npersona = 'slow'\n",
    )
    # Long talks, so that the kill lands mid-conversation.
    campaign.scripts("a.jsonl", scripts(6, turns=20))
    campaign.write("test_conversations.py", CONVERSATION_MODULE)
    process = campaign.start("--haico-exit", "campaign")
    process.wait_for(
        lambda: transcripts(campaign, "demo") >= 3, timeout=120, what="3 conversations"
    )
    postgres = service_pid(campaign, "demo", "postgres")
    assert postgres is not None

    os.kill(postgres, signal.SIGKILL)
    # At once: a run that waited for the turns' timeout would end only 600 s on.
    code = process.wait(timeout=TURN_TIMEOUT_S / 5)

    text = process.output()
    assert code == 75, text
    records = campaign.records("demo")
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
            f"*Interrupted: haico: postgres (pid {postgres}) was killed by SIGKILL while "
            "conversations were in flight !*",
            # Every item whose conversation had started is reported, and none started after.
            "*= 3 errors in *",
        ]
    )
    assert "not in pytest's counts" not in text


# A backend build whose migration changes the read-only role's password (as a broken
# pg_hba.conf or a careless migration would): the harness's snapshot login is refused.
BREAKING_MIGRATION = """
import os
import sys

import psycopg

with psycopg.connect(os.environ["HAICO_DATABASE_URL"], autocommit=True) as conn:
    conn.execute("ALTER ROLE haico_readonly PASSWORD 'changed-by-a-migration'")
os.execv(sys.executable, [sys.executable, "-m", "pytest_haico.standins.backend", *sys.argv[1:]])
"""


def test_a_refused_snapshot_connection_fails_the_arm_once_and_exits_78(
    campaign: CampaignProject,
) -> None:
    campaign.arm("demo")
    campaign.scripts("a.jsonl", scripts(3))
    campaign.write("test_conversations.py", CONVERSATION_MODULE)
    migration = campaign.write("migrate_then_serve.py", BREAKING_MIGRATION)
    command = f"{sys.executable} {migration} --host 127.0.0.1 --port {{port}}"
    result = campaign.run_subprocess(
        "--haico-exit", "campaign", "-v", "--haico-backend-cmd", command
    )
    assert result.ret == 78, result.stdout.str() + result.stderr.str()
    result.stdout.fnmatch_lines(
        [
            "*= haico =*",
            "stack failed (exit 78): the stack of arm demo did not start: the snapshot "
            "connection to postgres failed: OperationalError: *password authentication failed*",
        ]
    )
    assert "gate failed" not in result.stdout.str()  # the gates passed; the stack failed
    assert not re.search(r"haico_readonly:[^@\s]+@", result.stdout.str()), "a password was shown"
    assert campaign.records("demo") == []
    logs = next((campaign.arm_dir("demo") / "runs").iterdir()) / "logs"
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
    campaign: CampaignProject,
) -> None:
    campaign.arm("demo")
    campaign.scripts("a.jsonl", scripts(6))
    campaign.write("test_conversations.py", CONVERSATION_MODULE)
    campaign.write("conftest.py", SKIPPING_CONFTEST)
    result = campaign.run_subprocess("-rsx")
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines(
        [
            "haico: 0 done in ledger, 2 to run (0 retries); 4 skipped by marks",
            "*2 passed, 3 skipped, 1 xfailed*",
        ]
    )
    assert sorted(r["script"] for r in campaign.records("demo")) == ["s4", "s5"]
    assert transcripts(campaign, "demo") == 2


def _as_a_batch_shell_starts_it() -> None:
    """A non-interactive shell's background job: SIGINT (and SIGQUIT) inherited ignored."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["INT", "TERM"])
def test_int_or_term_to_a_pytest_started_in_the_background_records_interrupted_and_exits_75(
    campaign: CampaignProject, signum: int
) -> None:
    campaign.arm(
        "demo",
        f"[run]\nconcurrency = 2\nturn_timeout_s = {TURN_TIMEOUT_S}\n[standin]\npersona = 'hang'\n",
    )
    campaign.scripts("a.jsonl", scripts(4, text=HANGING_TURN))
    campaign.write("test_conversations.py", CONVERSATION_MODULE)
    process = campaign.start("--haico-exit", "campaign", preexec_fn=_as_a_batch_shell_starts_it)
    process.wait_for(
        lambda: transcripts(campaign, "demo") >= 2, timeout=120, what="2 conversations"
    )

    process.send_signal(signum)
    code = process.wait(timeout=STOP_WAIT_S)

    text = process.output()
    assert code == 75, text
    records = campaign.records("demo")
    assert [r["verdict"] for r in records] == ["interrupted", "interrupted"], text
    assert "Traceback" not in text


def held_requests(campaign: CampaignProject, arm: str) -> int:
    """How many requests the arm's hanging model server holds (or held) so far."""
    return sum(
        log.read_text(errors="replace").count("persona hang holds the request")
        for log in (campaign.arm_dir(arm) / "runs").glob("*/logs/llm.log")
    )


def test_a_model_server_that_exits_0_mid_run_ends_the_run_and_names_it(
    campaign: CampaignProject,
) -> None:
    """A model server that ends with status 0 while conversations are in flight (as vLLM's
    does after a fatal engine error) is a death: the run stops and blames the model server,
    whatever its exit status. (Persona dead, whose engine dies at its first request, is
    caught by the completion gate before any item: see test_gates_in_a_run.)"""
    campaign.arm(
        "demo",
        f"[run]\nconcurrency = 2\nturn_timeout_s = {TURN_TIMEOUT_S}\n[standin]\npersona = 'hang'\n",
    )
    campaign.scripts("a.jsonl", scripts(8, text=HANGING_TURN))
    campaign.write("test_conversations.py", CONVERSATION_MODULE)
    process = campaign.start("--haico-exit", "campaign")
    process.wait_for(
        lambda: held_requests(campaign, "demo") >= 2, timeout=120, what="2 conversations held"
    )
    llm = service_pid(campaign, "demo", "llm")
    assert llm is not None
    # The stand-in answers what it holds 503 while it shuts down, then exits 0.
    os.kill(llm, signal.SIGTERM)

    code = process.wait(timeout=TURN_TIMEOUT_S / 5)
    text = process.output()
    assert code == 75, text
    pytest.LineMatcher(text.splitlines()).fnmatch_lines(
        [
            f"stopped (exit 75): llm (pid {llm}) exited with status 0 while conversations "
            "were in flight*"
        ]
    )
    records = campaign.records("demo")
    # The conversations held at the signal may end before the process does (503 while it
    # shuts down), and another pair may start meanwhile; the watch then stops the run and
    # what is still in flight is cancelled. Which of them is blamed on the death depends on
    # when the process ends: the summary names it in any case.
    assert 2 <= len(records) < 8, text
    assert {r["verdict"] for r in records} <= {"infra_error", "interrupted"}
    assert "not in pytest's counts" not in text
