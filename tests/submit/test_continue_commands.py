"""`haico continue` and `haico submit` as real processes against a stand-in Slurm that keeps
its jobs (tests/submit/fake_slurm.py), with ledger records written by the test: one line
per share by the decision table, what a share owes from the ledgers, the newest attempt
opening the full stage, one writer per submission, and a journal reconciled by name."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.submit.campaign import Campaign, matches

# Every `campaign.haico(...)` is a real `haico` process.
pytestmark = pytest.mark.subprocess


def _smoke_then_full(campaign: Campaign) -> None:
    done = campaign.haico("submit", "demo", "--stage", "smoke")
    assert done.returncode == 0, done.stderr
    for stratum in ("default", "long"):
        for task in (0, 1):
            campaign.finish(f".smoke.demo.{stratum}", task)
    done = campaign.haico("submit", "demo", "--stage", "full", "--tasks", "2")
    assert done.returncode == 0, done.stderr


def test_one_line_per_share_says_its_end_what_it_owes_and_what_continue_does_about_it(
    campaign: Campaign,
) -> None:
    _smoke_then_full(campaign)
    full_default = str(campaign.job(".full.demo.default").job_id)
    full_long = str(campaign.job(".full.demo.long").job_id)
    # default task 0: out of walltime with one item done and one interrupted; task 1: the
    # user's scancel once it ran; long task 0: a gate failed; long task 1 still runs.
    campaign.record(".full.demo.default", 0, ["completed", "interrupted"])
    campaign.slurm.end(full_default, 0, "TIMEOUT")
    campaign.started(".full.demo.default", 1)
    campaign.slurm.end(full_default, 1, "CANCELLED", "0:15")
    run = campaign.campaign_dir / "demo" / "runs" / f"{full_long}_0.1"
    run.mkdir(parents=True)
    (run / "gates.json").write_text(
        json.dumps(
            {
                "failed_gate": "vllm_environment",
                "gates": [
                    {"name": "one_node", "passed": True, "detail": "1 node", "fix": ""},
                    {
                        "name": "vllm_environment",
                        "passed": False,
                        "detail": "no vllm in /opt/venv",
                        "fix": "set VLLM_VENV in cluster.env",
                    },
                ],
            }
        )
    )
    campaign.slurm.end(full_long, 0, "FAILED", "78:0")
    campaign.slurm.end(full_long, 1, "RUNNING")
    default_0 = campaign.items(".full.demo.default", 0)
    owed_0 = [spec for spec in default_0 if spec.item_id not in campaign.done]
    owed_1 = [s for s in campaign.items(".full.demo.default", 1) if s.item_id not in campaign.done]

    done = campaign.haico("continue", "demo")
    assert done.returncode == 1, done.stdout + done.stderr  # shares need a person
    matches(
        done.stdout,
        [
            "haico: smoke demo.default task 0 (job *_0): COMPLETED 0:0, nothing owed of 1 "
            "items: done",
            f"haico: full demo.default task 0 (job {full_default}_0): TIMEOUT 0:0, "
            f"{len(owed_0)} of {len(default_0)} items owed (1 interrupted*): rerun (round 2): "
            "out of walltime",
            f"haico: full demo.default task 1 (job {full_default}_1): CANCELLED 0:15, "
            f"{len(owed_1)} of * items owed ({len(owed_1)} without a record): cancelled "
            f"(scancel), not rerun: --include-cancelled reruns its {len(owed_1)} owed items",
            f"haico: full demo.long task 0 (job {full_long}_0): FAILED 78:0, * items owed *: "
            "terminal: gate vllm_environment failed: no vllm in /opt/venv; set VLLM_VENV in "
            "cluster.env",
            f"haico: full demo.long task 1 (job {full_long}_1): RUNNING 0:0, * items owed *: "
            "running, not resubmitted",
            "haico: *.continue-1.demo.default: job *, shards 0 of 2, --time 00:30:00 *",
        ],
    )
    [cont] = campaign.slurm.named(".continue-1.")
    argv = campaign.slurm.jobs()[cont]["argv"]
    assert "--array=0" in argv and any("HAICO_SHARD_COUNT=2" in a for a in argv)
    # It may take over the claim that the attempt it runs again left on its node.
    assert any(f"HAICO_SUPERSEDES={full_default}_0" in a.split(",") for a in argv), argv
    assert len(campaign.slurm.named(".continue-")) == 1, "a running or terminal share was rerun"

    # The cancelled share on request; the one being continued now waits for its rerun.
    again = campaign.haico("continue", "demo", "--include-cancelled")
    matches(
        again.stdout,
        [
            f"haico: full demo.default task 1 (job {full_default}_1): CANCELLED 0:15, *: "
            "rerun (round 2): cancelled, and --include-cancelled reruns it",
            f"haico: continue-1 demo.default task 0 (job {cont}_0): PENDING 0:0, *: "
            "pending, not resubmitted",
        ],
    )
    [rerun] = campaign.slurm.named(".continue-2.")
    assert "--array=1" in campaign.slurm.jobs()[rerun]["argv"]


def test_nothing_to_continue_only_when_nothing_is_owed_and_nothing_runs(
    campaign: Campaign,
) -> None:
    job = campaign.smoke_long()
    campaign.slurm.end(job, 1, "RUNNING")
    running = campaign.haico("continue", "demo")
    assert running.returncode == 0, running.stderr
    assert "nothing to continue" not in running.stdout
    matches(running.stdout, ["haico: nothing to resubmit: 1 share(s) pending or running"])

    # COMPLETED while its items have no record: reported, not taken for done.
    campaign.slurm.end(job, 1, "COMPLETED")
    odd = campaign.haico("continue", "demo")
    assert odd.returncode == 1
    matches(
        odd.stdout,
        [
            "*task 1 (job *_1): COMPLETED 0:0, 1 of 1 items owed *: terminal: "
            "inconsistent: it ended COMPLETED, yet 1 of its items have no "
            "terminal record*"
        ],
    )

    campaign.finish(".smoke.demo.long", 1)
    done = campaign.haico("continue", "demo")
    assert done.returncode == 0
    matches(
        done.stdout, ["haico: nothing to continue: every share of submission * is done (2 items)"]
    )


def test_a_smoke_share_that_timed_out_and_was_continued_to_completed_opens_the_full_stage(
    campaign: Campaign,
) -> None:
    smoke = campaign.smoke_long()
    campaign.slurm.end(smoke, 1, "TIMEOUT")
    refused = campaign.haico("submit", "demo", "--stage", "full", "--stratum", "long")
    assert refused.returncode == 2
    assert "task 1 ended TIMEOUT 0:0" in refused.stderr

    assert campaign.haico("continue", "demo").returncode == 0
    [cont] = campaign.slurm.named(".continue-1.")
    # While the continuation runs, the full stage waits for it (and not for the old task).
    pending = campaign.haico("submit", "demo", "--stage", "full", "--stratum", "long", "--dry-run")
    assert f"--dependency=afterok:{cont}" in pending.stdout, pending.stdout + pending.stderr
    campaign.finish(".continue-1.demo.long", 1)

    full = campaign.haico("submit", "demo", "--stage", "full", "--stratum", "long")
    assert full.returncode == 0, full.stderr
    [full_id] = campaign.slurm.named(".full.")
    assert not any(a.startswith("--dependency") for a in campaign.slurm.jobs()[full_id]["argv"])
    [checklist] = campaign.campaign_dir.glob("submissions/*/checklist.md")
    assert "continued to COMPLETED counts" in checklist.read_text()


def test_four_submits_of_one_campaign_at_once_submit_each_job_name_exactly_once(
    campaign: Campaign,
) -> None:
    (campaign.slurm.root / "sbatch-delay").write_text("0.5")
    env = {**os.environ, "PATH": campaign.slurm.path}
    argv = [sys.executable, "-m", "pytest_haico", "submit", "demo", "--stage", "smoke"]
    runs = [
        subprocess.Popen(
            argv,
            cwd=campaign.project,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    outputs = [run.communicate(timeout=120) for run in runs]
    assert [run.returncode for run in runs] == [0] * 4, outputs
    names = [job["name"] for job in campaign.slurm.jobs().values()]
    assert sorted(names) == sorted(set(names)) and len(names) == 2, names
    text = "".join(out + err for out, err in outputs)
    assert text.count("already submitted as job") == 6
    assert "--force" not in text
    submitted = [
        json.loads(line)
        for line in campaign.submission().journal.read_text().splitlines()
        if '"SUBMITTED"' in line
    ]
    assert len(submitted) == 2


def test_an_emptied_journal_adopts_the_jobs_slurm_has_by_name_and_submits_none_again(
    campaign: Campaign,
) -> None:
    assert campaign.haico("submit", "demo", "--stage", "smoke").returncode == 0
    before = campaign.slurm.jobs()
    journal = campaign.submission().journal
    journal.chmod(0o640)
    journal.write_bytes(b"")
    again = campaign.haico("submit", "demo", "--stage", "smoke")
    assert again.returncode == 0, again.stderr
    assert campaign.slurm.jobs().keys() == before.keys(), "submitted blindly"
    for job_id in before:
        assert f"found in Slurm as job {job_id}, which the journal did not record: adopted" in (
            again.stdout
        )
    states = [json.loads(line)["state"] for line in journal.read_text().splitlines()]
    assert states == ["PREPARED", "SUBMITTED"] * 2

    # Once Slurm forgot them too (no accounting here), haico cannot tell, and says so.
    journal.write_bytes(b"")
    for job_id in before:
        campaign.slurm.end(job_id, 0, "COMPLETED")
        campaign.slurm.end(job_id, 1, "COMPLETED")
    ambiguous = campaign.haico("submit", "demo", "--stage", "smoke")
    assert ambiguous.returncode == 2
    [line] = ambiguous.stderr.splitlines()
    assert "haico cannot tell whether haico.demo." in line and "--force haico.demo." in line
    assert campaign.slurm.jobs().keys() == before.keys()


def test_a_share_that_records_nothing_max_rounds_times_in_a_row_stops_and_progress_resets_it(
    campaign: Campaign,
) -> None:
    campaign.slurm.end(campaign.smoke_long("--limit", "4"), 1, "TIMEOUT")  # 2 items a task
    rounds = ("--max-rounds", "2")
    assert campaign.haico("continue", "demo", *rounds).returncode == 0
    # The first rerun finishes one item before its walltime: progress, counting starts again.
    campaign.record(".continue-1.demo.long", 1, ["completed"])
    campaign.slurm.end(campaign.slurm.named(".continue-1.")[0], 1, "TIMEOUT")
    assert campaign.haico("continue", "demo", *rounds).returncode == 0
    campaign.slurm.end(campaign.slurm.named(".continue-2.")[0], 1, "TIMEOUT")
    third = campaign.haico("continue", "demo", *rounds)
    assert third.returncode == 0, third.stdout
    matches(third.stdout, ["*continue-2 demo.long task 1 *: rerun (round 4): out of walltime"])
    campaign.slurm.end(campaign.slurm.named(".continue-3.")[0], 1, "TIMEOUT")
    stopped = campaign.haico("continue", "demo", *rounds)
    assert stopped.returncode == 1
    matches(
        stopped.stdout,
        [
            "*continue-3 demo.long task 1 (job *_1): TIMEOUT 0:0, 1 of 2 items owed (1 without "
            "a record): terminal: out of walltime, but its last 2 attempts in a row that had "
            "their chance (their walltime, or their stack up) recorded no item "
            "(--max-rounds 2): read its log *; a larger --max-rounds reruns it"
        ],
    )
    assert campaign.slurm.named(".continue-4.") == []


def test_attempts_cut_short_before_their_items_do_not_count_against_max_rounds(
    campaign: Campaign,
) -> None:
    # Each attempt is killed (TERM, USR1, kill -9: exit 75) while its stack starts, before
    # its gates passed: the fault is outside the share, which keeps being rerun.
    campaign.slurm.end(campaign.smoke_long(), 1, "FAILED", "75:0")
    rounds = ("--max-rounds", "2")
    for n in range(1, 4):
        assert campaign.haico("continue", "demo", *rounds).returncode == 0
        [rerun] = campaign.slurm.named(f".continue-{n}.")
        if n == 1:
            campaign.gates(f".continue-{n}.demo.long", 1, ["one_node", "walltime"])
        campaign.slurm.end(rerun, 1, "FAILED", "75:0")
    # Attempts that reached their conversations and finished none do count.
    for n in (4, 5):
        again = campaign.haico("continue", "demo", *rounds)
        assert again.returncode == 0, again.stdout
        [rerun] = campaign.slurm.named(f".continue-{n}.")
        campaign.gates(f".continue-{n}.demo.long", 1, ["one_node", "canary_turn"])
        campaign.slurm.end(rerun, 1, "FAILED", "75:0")
    stopped = campaign.haico("continue", "demo", *rounds)
    assert stopped.returncode == 1
    matches(
        stopped.stdout,
        [
            "*continue-5 demo.long task 1 *: FAILED 75:0, *: terminal: exit 75: drained, or "
            "items owed a retry, but its last 2 attempts in a row that had their chance "
            "(their walltime, or their stack up) recorded no item (--max-rounds 2)*"
        ],
    )


def test_a_full_stage_slurm_cancelled_for_a_failed_smoke_task_reruns_once_smoke_is_done(
    campaign: Campaign,
) -> None:
    smoke = campaign.smoke_long()
    done = campaign.haico("submit", "demo", "--stage", "full", "--stratum", "long", "--tasks", "2")
    assert done.returncode == 0, done.stderr
    [full] = campaign.slurm.named(".full.")
    # Task 0 of the smoke job is done already: the full stage waits for task 1 alone.
    assert f"--dependency=afterok:{smoke}_1" in campaign.slurm.jobs()[full]["argv"]
    # The smoke task runs out of walltime; afterok can no longer hold: Slurm cancels the
    # full stage before it starts (no log).
    campaign.slurm.end(smoke, 1, "TIMEOUT")
    campaign.slurm.end(full, 0, "CANCELLED")
    campaign.slurm.end(full, 1, "CANCELLED")
    first = campaign.haico("continue", "demo")
    assert first.returncode == 0, first.stdout + first.stderr
    matches(
        first.stdout,
        [
            "*smoke demo.long task 1 *: rerun (round 2): out of walltime",
            f"*full demo.long task 0 (job {full}_0): CANCELLED 0:0, *: Slurm cancelled it before "
            "it started, as a job it waited for failed; it runs again once the 1 owing smoke "
            "share(s) are done",
        ],
    )
    assert len(campaign.slurm.named(".continue-1.")) == 1  # the smoke share alone

    campaign.finish(".continue-1.demo.long", 1)
    second = campaign.haico("continue", "demo")
    assert second.returncode == 0, second.stdout + second.stderr
    matches(
        second.stdout,
        [
            f"*full demo.long task 0 (job {full}_0): CANCELLED 0:0, *: rerun (round 2): Slurm "
            "cancelled it before it started, as a job it waited for failed (the smoke shares "
            "are done now)",
        ],
    )
    [rerun] = campaign.slurm.named(".continue-2.")
    argv = campaign.slurm.jobs()[rerun]["argv"]
    assert "--array=0-1" in argv and not any(a.startswith("--dependency") for a in argv)


def test_a_continued_job_attaches_where_the_submitting_shell_did_whatever_the_continuing_one_says(
    campaign: Campaign, tmp_path: Path
) -> None:
    """The catalogue is frozen at the first submit: `haico continue` from another directory,
    with a CLUSTER_WORK of its own, gives the reruns the submitting shell's catalogue."""
    job = campaign.smoke_long()
    campaign.record(".smoke.demo.long", 1, ["interrupted"])
    campaign.slurm.end(job, 1, "TIMEOUT")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "pytest_haico", "continue", str(campaign.campaign_dir)],
        cwd=elsewhere,
        env={**os.environ, "PATH": campaign.slurm.path, "CLUSTER_WORK": str(elsewhere)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    [rerun] = campaign.slurm.named(".continue-1.")
    given = [a for a in campaign.slurm.jobs()[rerun]["argv"] if a.startswith("--haico-catalogue")]
    assert given == [f"--haico-catalogue={campaign.project / 'catalogue'}"]


def test_a_task_slurm_holds_after_its_launch_failed_is_cancelled_and_its_share_rerun(
    campaign: Campaign,
) -> None:
    """A network cut left a run on hn2; the requeued task's launch failed there and Slurm
    holds it (PENDING, Reason=launch_failed_requeued_held), for good unless someone
    releases it. `haico continue` cancels it and reruns the share, whose job may take over
    the claim of the run left behind; a held task with nothing owed is cancelled, done."""
    _smoke_then_full(campaign)
    full = str(campaign.job(".full.demo.default").job_id)
    long = str(campaign.job(".full.demo.long").job_id)
    campaign.record(".full.demo.default", 0, ["completed"])
    held = "launch_failed_requeued_held"
    campaign.slurm.end(full, 0, "PENDING", node="hn2", reason=held)
    campaign.finish(".full.demo.default", 1)
    campaign.finish(".full.demo.long", 0)
    campaign.record(".full.demo.long", 1, ["completed"] * len(campaign.items(".full.demo.long", 1)))
    campaign.slurm.end(long, 1, "PENDING", node="hn2", reason=held)

    done = campaign.haico("continue", "demo")
    assert done.returncode == 0, done.stdout + done.stderr
    matches(
        done.stdout,
        [
            f"haico: full demo.default task 0 (job {full}_0): PENDING 0:0 {held}, * items owed "
            f"*: rerun (round 2): held by Slurm, its launch failed on hn2 ({held}): it never "
            "starts by itself, so it is cancelled and rerun",
            f"haico: full demo.long task 1 (job {long}_1): PENDING 0:0 {held}, nothing owed of * "
            "items: done",
            f"haico: cancelled the held task {full}_0",
            f"haico: cancelled the held task {long}_1",
            "haico: *.continue-1.demo.default: job *, shards 0 of 2, *",
        ],
    )
    assert campaign.slurm.cancelled() == [f"{full}_0", f"{long}_1"]
    [cont] = campaign.slurm.named(".continue-1.")
    argv = campaign.slurm.jobs()[cont]["argv"]
    assert any(f"HAICO_SUPERSEDES={full}_0" in a.split(",") for a in argv), argv
