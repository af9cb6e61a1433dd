"""Ctrl-C while an arm's stack starts: the services stop, nothing is recorded, and the
session ends on one line saying so and pytest's own summary line; no "stack failed" (an
interrupt is no fault of the stack) and no bare KeyboardInterrupt with the line it was
raised on."""

from __future__ import annotations

import signal

import pytest

from tests.harness import BackgroundRun, CampaignProject
from tests.signals.conftest import llm_log_count, run_dir, services_alive, stack_campaign

LINE = (
    "! Interrupted: haico: interrupted while starting the stack of arm demo (SIGINT) after "
    "*.* s: its services are stopped, nothing ran and nothing was recorded !"
)


def assert_one_line_and_the_summary(run: BackgroundRun) -> None:
    text = run.output()
    lines = text.splitlines()
    pytest.LineMatcher(lines).fnmatch_lines([LINE, "*= no tests ran in *s =*"], consecutive=True)
    assert text.count("interrupted while starting the stack") == 1, text
    for noise in ("stack failed", "CancelledError", "KeyboardInterrupt", "--full-trace"):
        assert noise not in text, text


def test_ctrl_c_while_the_model_server_loads_ends_on_one_line(
    campaign: CampaignProject,
) -> None:
    # The stand-in model server takes 120 s to "load", twice its start timeout.
    stack_campaign(campaign, "[standin]\nload_s = 120\n", items=3)
    run = campaign.start()
    run.wait_for(
        lambda: llm_log_count(campaign, "loading the model") >= 1,
        timeout=120,
        what="the model server loading",
    )
    run.send_signal(signal.SIGINT)
    assert run.wait(timeout=50) == pytest.ExitCode.INTERRUPTED, run.output()
    assert_one_line_and_the_summary(run)
    assert campaign.records("demo") == []
    assert services_alive(run_dir(campaign)) == []


def test_ctrl_c_during_the_model_servers_gates_ends_on_one_line_and_exits_75(
    campaign: CampaignProject,
) -> None:
    # The gates ask for the served models, then for a one-token completion, which takes
    # 30 s: a probe is under way (on the runner's loop, cancelled by the interrupt) when the
    # signal comes.
    stack_campaign(campaign, "[standin]\nlatency_ms = 30000\n", items=3)
    run = campaign.start("--haico-exit", "campaign")
    run.wait_for(
        lambda: llm_log_count(campaign, "GET /v1/models HTTP/1.1") >= 1,
        timeout=120,
        what="the model server's gates",
    )
    run.send_signal(signal.SIGINT)
    assert run.wait(timeout=50) == 75, run.output()
    assert_one_line_and_the_summary(run)
    assert campaign.records("demo") == []
    assert services_alive(run_dir(campaign)) == []
