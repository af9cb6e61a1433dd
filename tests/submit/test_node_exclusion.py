"""`haico continue` attributes infrastructure failures to nodes: when they cluster on one
node while the same arm's shares record items elsewhere, its reruns exclude that node
(`sbatch --exclude`), say so in the share's line and in the dry run, keep it in the journal
for later rounds, and never exclude every node a share could run on. Real `haico`
processes against the stand-in Slurm of tests/submit/fake_slurm.py."""

from __future__ import annotations

import pytest

from tests.submit.campaign import Campaign, matches

pytestmark = pytest.mark.subprocess

FULL = ".full.demo.default"


def _full_over_two_tasks(campaign: Campaign) -> str:
    """The smoke stage of stratum default done on hn1 and hn3, then its full stage as two
    tasks (each owing the items its smoke task did not run); the full job's id."""
    done = campaign.haico("submit", "demo", "--stage", "smoke", "--stratum", "default")
    assert done.returncode == 0, done.stderr
    for task, node in ((0, "hn1"), (1, "hn3")):
        campaign.finish(".smoke.demo.default", task, node=node)
    done = campaign.haico(
        "submit", "demo", "--stage", "full", "--stratum", "default", "--tasks", "2"
    )
    assert done.returncode == 0, done.stderr
    return str(campaign.job(FULL).job_id)


def _both_fail_on(campaign: Campaign, fragment: str, node: str) -> None:
    """Task 0 of the job ends NODE_FAIL on `node`; task 1 runs there, records nothing but
    infrastructure failures, and exits 75."""
    job_id = str(campaign.job(fragment).job_id)
    campaign.slurm.end(job_id, 0, "NODE_FAIL", "0:0", node=node)
    campaign.record(fragment, 1, ["infra_error", "infra_error"], node=node)
    campaign.slurm.end(job_id, 1, "FAILED", "75:0", node=node)


def test_failures_clustered_on_one_node_rerun_those_shares_excluding_it(
    campaign: Campaign,
) -> None:
    campaign.slurm.set_nodes("hn1", "hn2", "hn3")
    full = _full_over_two_tasks(campaign)
    _both_fail_on(campaign, FULL, "hn2")

    dry = campaign.haico("continue", "demo", "--dry-run")
    assert dry.returncode == 0, dry.stdout + dry.stderr
    matches(
        dry.stdout,
        [
            f"haico: full demo.default task 0 (job {full}_0): NODE_FAIL 0:0, * owed*: rerun "
            "(round 2): its node failed; node hn2 excluded (2 attempts failed there)",
            f"haico: full demo.default task 1 (job {full}_1): FAILED 75:0, * owed*: rerun "
            "(round 2): exit 75: drained, or items owed a retry; node hn2 excluded (2 attempts "
            "failed there)",
            f"haico: the reruns exclude node(s) hn2 (2 attempts failed there: {full}_0: "
            f"NODE_FAIL; {full}_1.1: 2 of its 2 records infrastructure failures; 2 attempts of "
            "the same arm recorded items on other nodes)",
            "# *.continue-1.demo.default: *",
            "*--exclude=hn2*",
        ],
    )
    assert "--exclude" not in dry.stdout.split("# ")[0]  # the lines above the plan say it

    done = campaign.haico("continue", "demo")
    assert done.returncode == 0, done.stdout + done.stderr
    [continuation] = campaign.slurm.named(".continue-1.demo.default")
    argv = campaign.slurm.jobs()[continuation]["argv"]
    assert "--exclude=hn2" in argv
    assert "--array=0-1" in argv  # those indices alone
    assert campaign.job(".continue-1.demo.default").plan.exclude == ("hn2",)


def test_an_excluded_node_stays_excluded_in_later_rounds(campaign: Campaign) -> None:
    campaign.slurm.set_nodes("hn1", "hn2", "hn3")
    _full_over_two_tasks(campaign)
    _both_fail_on(campaign, FULL, "hn2")
    assert campaign.haico("continue", "demo").returncode == 0
    # Round 2 is out of walltime on hn1: no new failure of a node, hn2 still excluded.
    second = str(campaign.job(".continue-1.demo.default").job_id)
    for task in (0, 1):
        campaign.slurm.end(second, task, "TIMEOUT", node="hn1")

    done = campaign.haico("continue", "demo")
    assert done.returncode == 0, done.stdout + done.stderr
    matches(
        done.stdout,
        [
            f"haico: continue-1 demo.default task 0 (job {second}_0): TIMEOUT 0:0, *: rerun "
            "(round 3): out of walltime",
            "haico: the reruns exclude node(s) hn2 (2 attempts failed there: *)",
        ],
    )
    [third] = campaign.slurm.named(".continue-2.demo.default")
    assert "--exclude=hn2" in campaign.slurm.jobs()[third]["argv"]


def test_no_exclude_reruns_without_keeping_any_node_out(campaign: Campaign) -> None:
    campaign.slurm.set_nodes("hn1", "hn2", "hn3")
    _full_over_two_tasks(campaign)
    _both_fail_on(campaign, FULL, "hn2")

    done = campaign.haico("continue", "demo", "--no-exclude")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "excluded" not in done.stdout
    [continuation] = campaign.slurm.named(".continue-1.demo.default")
    assert not any(a.startswith("--exclude") for a in campaign.slurm.jobs()[continuation]["argv"])


def test_a_single_failure_on_a_node_is_rerun_without_excluding_it(campaign: Campaign) -> None:
    campaign.slurm.set_nodes("hn1", "hn2", "hn3")
    full = _full_over_two_tasks(campaign)
    campaign.slurm.end(full, 0, "NODE_FAIL", node="hn2")
    campaign.finish(FULL, 1, node="hn1")

    done = campaign.haico("continue", "demo")
    assert done.returncode == 0, done.stdout + done.stderr
    matches(done.stdout, [f"haico: full demo.default task 0 (job {full}_0): *: its node failed"])
    assert "excluded" not in done.stdout
    [continuation] = campaign.slurm.named(".continue-1.demo.default")
    assert not any(a.startswith("--exclude") for a in campaign.slurm.jobs()[continuation]["argv"])


@pytest.mark.parametrize("left", ["run-config", "claim"])
def test_a_gate_that_failed_on_one_node_and_passed_on_others_is_the_nodes_fault(
    campaign: Campaign, left: str
) -> None:
    campaign.slurm.set_nodes("hn1", "hn2", "hn3")
    full = _full_over_two_tasks(campaign)
    # A dynamic gate's run wrote its run-config; a static gate's, only its claim.
    if left == "claim":
        campaign.claim(FULL, 0, node="hn2")
    else:
        campaign.run_config(FULL, 0, node="hn2")
    campaign.gates(FULL, 0, ["one_node"], failed="canary_turn")
    campaign.slurm.end(full, 0, "FAILED", "78:0", node="hn2")
    campaign.gates(FULL, 1, ["one_node", "canary_turn"])
    campaign.finish(FULL, 1, node="hn1")

    done = campaign.haico("continue", "demo")
    assert done.returncode == 0, done.stdout + done.stderr
    matches(
        done.stdout,
        [
            f"haico: full demo.default task 0 (job {full}_0): FAILED 78:0, *: rerun (round 2): "
            "gate canary_turn failed on node hn2, and passed for this arm on hn1: the "
            "node, not the campaign",
        ],
    )


def test_a_gate_that_failed_everywhere_stays_terminal(campaign: Campaign) -> None:
    campaign.slurm.set_nodes("hn1", "hn2", "hn3")
    full = _full_over_two_tasks(campaign)
    for task, node in ((0, "hn1"), (1, "hn2")):
        campaign.run_config(FULL, task, node=node)
        campaign.gates(FULL, task, ["one_node"], failed="canary_turn")
        campaign.slurm.end(full, task, "FAILED", "78:0", node=node)

    done = campaign.haico("continue", "demo")
    assert done.returncode == 1, done.stdout + done.stderr
    matches(
        done.stdout, ["haico: full demo.default task 0 (*): terminal: gate canary_turn failed*"]
    )


def test_excluding_every_node_of_the_partition_stops_and_names_them(campaign: Campaign) -> None:
    # The default partition has hn1 and hn2; hn3 (which ran the smoke shares) is in another.
    campaign.slurm.set_nodes("hn1", "hn2")
    done = campaign.haico("submit", "demo", "--stage", "smoke", "--stratum", "default")
    assert done.returncode == 0, done.stderr
    for task in (0, 1):
        campaign.finish(".smoke.demo.default", task, node="hn3")
    assert (
        campaign.haico(
            "submit", "demo", "--stage", "full", "--stratum", "default", "--tasks", "2"
        ).returncode
        == 0
    )
    _both_fail_on(campaign, FULL, "hn1")
    assert campaign.haico("continue", "demo").returncode == 0  # hn1 excluded
    _two_fail_on_continuation(campaign, "hn2")

    done = campaign.haico("continue", "demo")
    assert done.returncode == 1, done.stdout + done.stderr
    matches(
        done.stdout,
        [
            "haico: continue-1 demo.default task 0 (*): NODE_FAIL 0:0, *: terminal: its node "
            "failed, but every node of the default partition is excluded: hn1 (2 attempts "
            "failed there: *), hn2 (2 attempts failed there: *); ask your site to look at them "
            "(sinfo -R), then `haico continue --no-exclude` runs on them again",
        ],
    )
    assert not campaign.slurm.named(".continue-2.")


def _two_fail_on_continuation(campaign: Campaign, node: str) -> None:
    job_id = str(campaign.job(".continue-1.demo.default").job_id)
    for task in (0, 1):
        campaign.slurm.end(job_id, task, "NODE_FAIL", node=node)
