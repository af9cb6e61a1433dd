"""Rerunning the same command resumes: done items are deselected, infra failures retried."""

from __future__ import annotations

import pytest

from tests.harness import CampaignProject


def verdicts(campaign: CampaignProject, arm: str = "demo") -> list[tuple[str, int, str]]:
    return [(r["script"], r["attempt"], r["verdict"]) for r in campaign.records(arm)]


def test_rerun_deselects_items_whose_newest_record_is_terminal(campaign: CampaignProject) -> None:
    campaign.arm("demo")
    campaign.simple_scripts("a", "b")
    campaign.scripts("c.yaml", "id: c\nturns:\n  - user: infra down\n")
    campaign.scripts("d.yaml", "id: d\nturns:\n  - user: fail please\n")
    first = campaign.run()
    first.assert_outcomes(passed=2, failed=2)
    first.stdout.fnmatch_lines(["haico: 0 done in ledger, 4 to run (0 retries)"])
    second = campaign.run("-v")
    second.stdout.fnmatch_lines(
        [
            "*collected 4 items / 3 deselected / 1 selected",
            "haico: 3 done in ledger, 1 to run (1 retries)",
            "*test_conversation?demo-c-r0? FAILED*",
        ]
    )
    assert sorted(verdicts(campaign)) == [
        ("a", 1, "completed"),
        ("b", 1, "completed"),
        ("c", 1, "infra_error"),
        ("c", 2, "infra_error"),
        ("d", 1, "expectation_failed"),
    ]


def test_infra_failures_are_retried_until_max_attempts_then_gave_up(
    campaign: CampaignProject,
) -> None:
    campaign.arm("demo")
    campaign.scripts("c.yaml", "id: c\nturns:\n  - user: infra down\n")
    campaign.scripts("r.yaml", "id: r\nturns:\n  - user: ratelimit hit\n")
    for _ in range(3):
        campaign.run("--haico-max-attempts", "2")
    assert sorted(verdicts(campaign)) == [
        ("c", 1, "infra_error"),
        ("c", 2, "gave_up"),
        ("r", 1, "rate_limited"),
        ("r", 2, "gave_up"),
    ]
    outcomes = {r["verdict"]: r["outcome"] for r in campaign.records("demo")}
    assert outcomes == {"infra_error": "error", "rate_limited": "error", "gave_up": "error"}
    runs = sorted(path.name for path in (campaign.arm_dir("demo") / "runs").iterdir())
    campaign.run("--haico-max-attempts", "2").stdout.fnmatch_lines(
        ["haico: 2 done in ledger, 0 to run (0 retries)"]
    )
    # A run with nothing to run leaves no run directory behind.
    assert sorted(path.name for path in (campaign.arm_dir("demo") / "runs").iterdir()) == runs


@pytest.mark.subprocess
def test_an_interrupted_attempt_is_retried_without_counting(
    campaign: CampaignProject, monkeypatch: pytest.MonkeyPatch
) -> None:
    campaign.arm("demo")
    campaign.scripts("i.yaml", "id: i\nturns:\n  - user: interrupt me\n")
    campaign.run_subprocess()
    campaign.run_subprocess()
    monkeypatch.setenv("HAICO_TEST_FLIP", "1")
    campaign.run().assert_outcomes(passed=1)
    # In start order: run ids sort by second and pid, and the three may share a second.
    records = sorted(campaign.records("demo"), key=lambda r: r["started_at"])
    assert [(r["script"], r["attempt"], r["verdict"]) for r in records] == [
        ("i", 1, "interrupted"),
        ("i", 1, "interrupted"),
        ("i", 1, "completed"),
    ]


def test_no_resume_reruns_everything(campaign: CampaignProject) -> None:
    campaign.arm("demo")
    campaign.simple_scripts("a", "b")
    campaign.run()
    again = campaign.run("--haico-no-resume")
    again.assert_outcomes(passed=2)
    again.stdout.fnmatch_lines(["haico: resume off (--haico-no-resume), 2 to run"])
    assert len(campaign.records("demo")) == 4


def test_two_runs_in_one_job_get_their_own_run_and_ledger(
    campaign: CampaignProject, monkeypatch: pytest.MonkeyPatch
) -> None:
    campaign.arm("demo")
    campaign.simple_scripts("a")
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    campaign.run("--haico-no-resume")
    campaign.run("--haico-no-resume")
    assert [p.name for p in campaign.ledger_files("demo")] == ["4242.1.jsonl", "4242.2.jsonl"]
    runs = campaign.root / "results" / "default" / "demo" / "runs"
    assert sorted(p.name for p in runs.iterdir()) == ["4242.1", "4242.2"]
    assert [r["run_id"] for r in campaign.records("demo")] == ["4242.1", "4242.2"]
    assert campaign.records("demo")[0]["slurm"]["job_id"] == "4242"


def test_run_id_of_a_requeued_array_task(
    campaign: CampaignProject, monkeypatch: pytest.MonkeyPatch
) -> None:
    campaign.arm("demo")
    campaign.simple_scripts("a")
    for name, value in {
        "SLURM_JOB_ID": "77",
        "SLURM_ARRAY_JOB_ID": "70",
        "SLURM_ARRAY_TASK_ID": "3",
        "SLURM_RESTART_COUNT": "1",
    }.items():
        monkeypatch.setenv(name, value)
    campaign.run("--haico-shard", "0/1")
    assert [p.name for p in campaign.ledger_files("demo")] == ["70_3r1.1.jsonl"]


def test_strict_exit_codes(campaign: CampaignProject) -> None:
    campaign.arm("demo")
    campaign.simple_scripts("a")
    assert campaign.run().ret == pytest.ExitCode.OK
    assert campaign.run("-k", "nothing-matches").ret == pytest.ExitCode.NO_TESTS_COLLECTED
    campaign.scripts("f.yaml", "id: f\nturns:\n  - user: fail\n")
    assert campaign.run().ret == pytest.ExitCode.TESTS_FAILED
    assert campaign.run("--haico-shard", "2/2").ret == pytest.ExitCode.USAGE_ERROR


def test_a_rerun_with_everything_done_exits_0_with_one_summary_line(
    campaign: CampaignProject,
) -> None:
    campaign.arm("demo")
    campaign.simple_scripts("a", "b")
    campaign.scripts("f.yaml", "id: f\nturns:\n  - user: fail\n")
    assert campaign.run().ret == pytest.ExitCode.TESTS_FAILED
    for mode in ("strict", "campaign"):
        again = campaign.run("--haico-exit", mode)
        assert again.ret == pytest.ExitCode.OK
        again.stdout.fnmatch_lines(
            [
                "haico: 3 done in ledger, 0 to run (0 retries)",
                "*= haico =*",
                # Where pytest started: relative to it.
                "campaign default: 3 of 3 done, results in results/default",
                "*= 3 deselected in *",
            ]
        )


@pytest.mark.subprocess
def test_collect_only_lists_every_item_with_its_ledger_state(
    campaign: CampaignProject,
) -> None:
    campaign.arm("demo")
    campaign.simple_scripts("a")
    campaign.scripts("c.yaml", "id: c\nturns:\n  - user: infra down\n")
    campaign.scripts("i.yaml", "id: i\nturns:\n  - user: interrupt me\n")
    campaign.run_subprocess()
    campaign.simple_scripts("n")
    runs = sorted((campaign.arm_dir("demo") / "runs").iterdir())
    listed = campaign.run("--collect-only", "-q")
    assert listed.ret == pytest.ExitCode.OK
    listed.stdout.fnmatch_lines(
        [
            "haico: 1 done in ledger, 3 to run (1 retries, 1 resumed after interruption)",
            "haico: done (completed)            demo-a-r0",
            "haico: owed: retry (attempt 2)     demo-c-r0",
            "haico: owed: resume (interrupted)  demo-i-r0",
            "haico: new                         demo-n-r0",
        ],
        consecutive=True,
    )
    listed.stdout.fnmatch_lines(["experiments/test_conversations.py::test_conversation[demo-a-r0]"])
    assert sorted((campaign.arm_dir("demo") / "runs").iterdir()) == runs  # nothing claimed


def test_campaign_exit_codes(campaign: CampaignProject, monkeypatch: pytest.MonkeyPatch) -> None:
    campaign.arm("demo")
    campaign.simple_scripts("a")
    campaign.scripts("f.yaml", "id: f\nturns:\n  - user: fail\n")
    assert campaign.run("--haico-exit", "campaign").ret == 0  # finished, whatever the verdicts
    assert campaign.run("--haico-exit", "campaign").ret == 0  # everything already done
    campaign.scripts("x.yaml", "id: x\nturns:\n  - user: flip\n")
    owed = campaign.run("--haico-exit", "campaign")
    assert owed.ret == 75
    owed.stdout.fnmatch_lines(["1 item(s) must run again: rerun the same command"])
    monkeypatch.setenv("HAICO_TEST_FLIP", "1")
    assert campaign.run("--haico-exit", "campaign").ret == 0
    assert verdicts(campaign)[-2:] == [("x", 1, "infra_error"), ("x", 2, "completed")]


@pytest.mark.subprocess
def test_campaign_exit_code_of_an_interrupted_run_is_75(campaign: CampaignProject) -> None:
    campaign.arm("demo")
    campaign.scripts("i.yaml", "id: i\nturns:\n  - user: interrupt me\n")
    assert campaign.run_subprocess("--haico-exit", "campaign").ret == 75


def test_exit_mode_from_ini(campaign: CampaignProject) -> None:
    campaign.pytester.makepyprojecttoml(
        '[tool.pytest.ini_options]\nhaico_exit = "campaign"\n'
        'asyncio_default_fixture_loop_scope = "function"\n'
    )
    campaign.arm("demo")
    campaign.scripts("c.yaml", "id: c\nturns:\n  - user: infra down\n")
    assert campaign.run().ret == 75


def test_a_damaged_ledger_is_read_with_a_warning_and_never_rewritten(
    campaign: CampaignProject,
) -> None:
    campaign.arm("demo")
    campaign.simple_scripts("a", "b")
    campaign.run()
    (ledger,) = campaign.ledger_files("demo")
    intact = ledger.read_bytes()
    torn = intact + b'{"schema": 1, "item_id": "'
    ledger.write_bytes(torn)
    (ledger.parent / "garbage.jsonl").write_bytes(b"\x00\x01 not json\n")
    result = campaign.run()
    result.stdout.fnmatch_lines(
        [
            f"haico: ledger warning: {ledger.parent / 'garbage.jsonl'}:1: skipped not valid JSON",
            f"haico: ledger warning: {ledger}:3: skipped a torn last line (a kill mid-write?)",
            "haico: 2 done in ledger, 0 to run (0 retries)",
        ]
    )
    assert ledger.read_bytes() == torn


def test_the_plugin_can_be_disabled(campaign: CampaignProject) -> None:
    campaign.arm("demo")
    campaign.simple_scripts("a")
    result = campaign.run("-p", "no:haico")
    result.stdout.fnmatch_lines(["*fixture 'haico_item' not found*"])
    assert not (campaign.root / "results").exists()
