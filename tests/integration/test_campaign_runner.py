"""Conversations in flight: records the moment they end, a breaker, and interrupts."""

from __future__ import annotations

import json
import os
import re
import signal
from collections import Counter

from tests.harness import CONVERSATION_MODULE, CampaignProject

PASSED = re.compile(r"test_conversation\[(.+)\] PASSED")


def quick_scripts(count: int, *, text: str = "hello") -> str:
    return "".join(
        f'{{"id": "quick{i}", "turns": [{{"user": "{text} {i}"}}]}}\n' for i in range(count)
    )


def test_kill_9_keeps_the_records_of_conversations_pytest_had_not_reported(
    campaign: CampaignProject,
) -> None:
    # The first item is a long conversation, so pytest waits on it while the seven
    # quick ones, in flight beside it, end and are recorded.
    campaign.arm("demo", "[run]\nconcurrency = 8\n[standin]\nlatency_ms = 150\n")
    long_turns = ", ".join(f'{{"user": "step {i} of a long talk"}}' for i in range(30))
    campaign.scripts("a.jsonl", f'{{"id": "a-long", "turns": [{long_turns}]}}\n')
    campaign.scripts("b.jsonl", quick_scripts(7))
    campaign.write("test_conversations.py", CONVERSATION_MODULE)
    process = campaign.start("-v")
    process.wait_for(
        lambda: len(campaign.ledger_lines("demo")) >= 7,
        timeout=120,
        what="the seven quick conversations to be recorded",
    )
    os.kill(process.pid, signal.SIGKILL)
    process.wait(timeout=30)

    records = [json.loads(line) for line in campaign.ledger_lines("demo")]
    assert sorted(r["script"] for r in records) == [f"quick{i}" for i in range(7)]
    assert not PASSED.findall(process.output()), "pytest was still waiting on the first item"
    assert {r["in_flight_at_start"] for r in records} - {0}, "they ran concurrently"
    transcripts = campaign.arm_dir("demo") / "transcripts"
    for record in records:
        name = f"{record['item_id']}.{record['run_id']}.{record['attempt']}.jsonl"
        assert (transcripts / name).stat().st_size > 0

    rerun = campaign.run_subprocess("--haico-exit", "campaign")
    assert rerun.ret == 0, rerun.stdout.str()
    assert "haico: 7 done in ledger, 1 to run (0 retries)" in rerun.stdout.str()


def test_the_circuit_breaker_stops_a_bad_stack_and_exits_75(campaign: CampaignProject) -> None:
    campaign.arm(
        "demo",
        "[run]\nconcurrency = 2\nturn_timeout_s = 1\n[standin]\npersona = 'hang'\n",
    )
    # Persona hang answers the first request (a tool call, for an artifact) and holds the
    # next one: every conversation hangs until its turn times out.
    campaign.scripts("a.jsonl", quick_scripts(12, text="Write it up as a document, part"))
    campaign.write("test_conversations.py", CONVERSATION_MODULE)
    result = campaign.run_subprocess()
    assert result.ret == 75, result.stdout.str()
    assert re.search(
        r"stopped \(exit 75\): circuit breaker: 5 of the last 5 conversations "
        r"failed on infrastructure \(mostly: backend\); the tail of the backend "
        r"log:",
        result.stdout.str(),
    ), result.stdout.str()
    records = campaign.records("demo")
    # It stops admitting at the fifth failure and records the one other conversation then
    # in flight (concurrency 2) at once: none starts after the stop.
    assert 5 <= len(records) <= 5 + 1
    assert {r["verdict"] for r in records} <= {"infra_error", "interrupted"}
    # pytest reports every item whose conversation started: its counts are the records.
    verdicts = Counter(r["verdict"] for r in records)
    counts = ", ".join(f"{verdicts[v]} {v}" for v in ("infra_error", "interrupted") if verdicts[v])
    result.stdout.fnmatch_lines(
        [
            f"demo: {len(records)} item(s) in * s (stack included): {counts}",
            "*Interrupted: haico: circuit breaker: 5 of the last 5 conversations failed *",
            f"*= {len(records)} errors in *",
        ]
    )
    assert "not in pytest's counts" not in result.stdout.str()


def test_haico_concurrency_overrides_the_arm(campaign: CampaignProject) -> None:
    campaign.arm("demo", "[run]\nconcurrency = 8\n[standin]\nlatency_ms = 100\n")
    campaign.scripts("a.jsonl", quick_scripts(6))
    campaign.write("test_conversations.py", CONVERSATION_MODULE)
    result = campaign.run_subprocess("--haico-concurrency", "2")
    assert result.ret == 0, result.stdout.str()
    assert {r["in_flight_at_start"] for r in campaign.records("demo")} == {0, 1}
