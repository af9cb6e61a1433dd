"""`haico submit` and `haico continue` against real Slurm daemons: stages and their
dependency, shards covering every item once, the journal surviving a kill of haico between
SUBMITTING and SUBMITTED, the allow-listed environment seen inside a job, the digest gate,
`haico continue --until-done` rerunning the one shard that was cut short to the end, and a
user's scancel held until --include-cancelled."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from tests.polling import wait_for
from tests.slurm.cluster import SlurmCluster
from tests.slurm.project import (
    SECRET,
    TERMINAL,
    Project,
    end_time_in,
    make_project,
    smoke_then_full,
    terminal_once,
    work_items,
)


@pytest.fixture
def project(tmp_path: Path, slurm_cluster: SlurmCluster) -> Project:
    return make_project(tmp_path, slurm_cluster)


def _squeue(cluster: SlurmCluster, *ids: str) -> dict[str, tuple[str, str]]:
    out = cluster.run("squeue", "-h", "-j", ",".join(ids), "-o", "%F %T %r").stdout
    return {line.split()[0]: tuple(line.split()[1:3]) for line in out.splitlines()}  # type: ignore[misc]


def test_smoke_then_full_after_it_every_item_once_and_no_token_in_any_job(
    project: Project,
) -> None:
    smoke = project.haico("submit", "demo", "--stage", "smoke", "--stratum", "default")
    assert smoke.returncode == 0, smoke.stderr
    full = project.haico(
        "submit", "demo", "--stage", "full", "--stratum", "default", "--tasks", "3"
    )
    assert full.returncode == 0, full.stderr
    [smoke_id] = project.job_ids("smoke")
    [full_id] = project.job_ids("full")
    assert f"after afterok:{smoke_id}" in full.stdout
    # The full stage waits for the smoke job in the queue: Slurm's own record says so.
    wait_for(
        lambda: _squeue(project.cluster, full_id).get(full_id) == ("PENDING", "Dependency"),
        timeout=10,
        what="squeue to show the full job pending on its dependency",
    )
    assert _squeue(project.cluster, smoke_id)[smoke_id][0] in ("PENDING", "RUNNING")
    fields = project.cluster.job_fields(full_id)
    assert fields.get("Dependency", "").startswith(f"afterok:{smoke_id}")

    ends = project.cluster.wait_ended(smoke_id, full_id)
    assert set(ends.values()) == {"COMPLETED"}, ends
    assert len(ends) == 2 + 3

    records = project.records()
    demo_default = [r for r in records if r["stratum"] == "default" and r["verdict"] in TERMINAL]
    per_item = Counter(r["item_id"] for r in demo_default)
    assert len(per_item) == 6  # every item of the demo's stratum default
    assert set(per_item.values()) == {1}, "an item ran twice"
    by_job = Counter((r["slurm"]["array_job_id"], r["slurm"]["array_task_id"]) for r in records)
    # --limit 2 (the default): 2 items of the stratum in all, one on each of the 2 tasks.
    assert sum(n for (job, _), n in by_job.items() if job == smoke_id) == 2
    assert {task for job, task in by_job if job == full_id} <= {"0", "1", "2"}

    # The allow-listed environment: nothing of the submitting shell's tokens or Slurm
    # variables; haico's own settings present.
    dumps = [json.loads(p.read_text()) for p in project.env_dumps.glob("*.json")]
    assert len(dumps) == 5
    for environ in dumps:
        assert "OPENAI_API_KEY" not in environ
        assert "PYTEST_HAICO_CONCURRENCY" not in environ
        assert environ.get("SLURM_MEM_PER_CPU") != "7"
        assert SECRET not in json.dumps(environ)
        assert environ["HAICO_INPUTS_DIGEST"].startswith("sha256:")
    assert SECRET not in "".join(
        p.read_text(errors="replace") for p in project.campaign_dir.rglob("*") if p.is_file()
    )


def test_a_kill_between_submitting_and_submitted_is_reconciled_never_submitted_twice(
    project: Project, tmp_path: Path
) -> None:
    # An sbatch that submits, then hangs before haico reads its answer.
    shim = tmp_path / "shim"
    shim.mkdir()
    real = shutil.which("sbatch")
    marker = tmp_path / "submitted"
    (shim / "sbatch").write_text(
        f'#!/bin/bash\n{real} "$@" > {tmp_path}/answer\ntouch {marker}\nexec sleep 300\n'
    )
    (shim / "sbatch").chmod(0o755)
    env = {
        **os.environ,
        **project.cluster.env,
        "PATH": f"{shim}:{os.environ['PATH']}",
    }
    haico = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pytest_haico",
            "submit",
            "demo",
            "--stage",
            "smoke",
            "--stratum",
            "long",
        ],
        cwd=project.root,
        env=env,
        start_new_session=True,
    )
    try:
        wait_for(marker.exists, timeout=60, what="the shim's submission")
    finally:
        os.killpg(haico.pid, signal.SIGKILL)
        haico.wait()
    journal = project.journal()
    assert journal[-1]["state"] == "SUBMITTING"
    name = journal[-1]["job"]
    job_id = (tmp_path / "answer").read_text().strip()

    rerun = project.haico("submit", "demo", "--stage", "smoke", "--stratum", "long")
    assert rerun.returncode == 0, rerun.stderr
    assert f"found as job {job_id}" in rerun.stdout
    assert "already submitted as job " + job_id in rerun.stdout
    named = project.cluster.run("squeue", "-h", "-t", "all", "--name", name, "-o", "%F").stdout
    assert set(named.split()) == {job_id}, "the job was submitted twice"
    last = project.journal()[-1]
    assert (last["state"], last["job_id"], last["how"]) == (
        "SUBMITTED",
        job_id,
        "reconciled by name",
    )
    project.cluster.wait_ended(job_id)


def test_a_kill_before_sbatch_answered_with_no_job_blocks_until_forced(
    project: Project, tmp_path: Path
) -> None:
    shim = tmp_path / "shim"
    shim.mkdir()
    marker = tmp_path / "called"
    (shim / "sbatch").write_text(f"#!/bin/bash\ntouch {marker}\nexec sleep 300\n")
    (shim / "sbatch").chmod(0o755)
    env = {**os.environ, **project.cluster.env, "PATH": f"{shim}:{os.environ['PATH']}"}
    haico = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pytest_haico",
            "submit",
            "demo",
            "--stage",
            "smoke",
            "--stratum",
            "long",
        ],
        cwd=project.root,
        env=env,
        start_new_session=True,
    )
    try:
        wait_for(marker.exists, timeout=60, what="sbatch called")
    finally:
        os.killpg(haico.pid, signal.SIGKILL)
        haico.wait()
    name = project.journal()[-1]["job"]

    blocked = project.haico("submit", "demo", "--stage", "smoke", "--stratum", "long")
    assert blocked.returncode == 2
    assert blocked.stdout == ""
    [line] = blocked.stderr.splitlines()
    assert f"--force {name}" in line and "Traceback" not in blocked.stderr
    assert project.journal()[-1]["state"] == "SUBMITTING"

    forced = project.haico(
        "submit", "demo", "--stage", "smoke", "--stratum", "long", "--force", name
    )
    assert forced.returncode == 0, forced.stderr
    [job_id] = project.job_ids("smoke")
    assert set(project.cluster.wait_ended(job_id).values()) == {"COMPLETED"}


def test_an_edit_of_the_frozen_inputs_after_submission_is_refused_by_the_digest_gate(
    project: Project,
) -> None:
    smoke = project.haico("submit", "demo", "--stage", "smoke", "--stratum", "long")
    assert smoke.returncode == 0, smoke.stderr
    [smoke_id] = project.job_ids("smoke")
    assert set(project.cluster.wait_ended(smoke_id).values()) == {"COMPLETED"}
    before = len(project.records())

    [frozen] = project.campaign_dir.glob("submissions/*/experiments/scripts/long.jsonl")
    frozen.chmod(0o644)
    frozen.write_text(frozen.read_text().replace("eight weeks", "six weeks"))
    full = project.haico("submit", "demo", "--stage", "full", "--stratum", "long")
    assert full.returncode == 0, full.stderr
    assert "already submitted" not in full.stdout
    [full_id] = project.job_ids("full")
    ends = project.cluster.wait_ended(full_id)
    assert set(ends.values()) == {"FAILED"}, ends
    [task] = [project.cluster.job_fields(t) for t in ends]
    assert task["ExitCode"] == "78:0"
    [log] = project.campaign_dir.glob(f"submissions/*/logs/full.demo.long-{full_id}_0.out")
    text = log.read_text()
    assert "inputs_present" in text and "edited after `haico submit`" in text
    assert len(project.records()) == before, "an item ran on edited inputs"


def test_until_done_after_a_shard_hit_its_walltime_runs_only_what_it_owes_to_the_end(
    project: Project,
) -> None:
    # Eight items of three turns at 5 s a completion, one conversation at a time: after a
    # smoke of two, the busier of two full tasks holds at least three (45 s of work), so
    # it is still running at the controller's next time-limit check (at most 30 s away).
    work_items(project, count=8, turns=3, latency_ms=5000)
    full_id = smoke_then_full(project, tasks=2, time="20")

    def to_run() -> dict[int, int] | None:
        counts = {}
        for task in (0, 1):
            logs = list(
                project.campaign_dir.glob(f"submissions/*/logs/full.*-{full_id}_{task}.out")
            )
            found = re.search(r"(\d+) to run", logs[0].read_text()) if logs else None
            if found is None:
                return None
            counts[task] = int(found[1])
        return counts

    wait_for(lambda: to_run() is not None, timeout=90, what="both full tasks' status lines")
    counts = to_run()
    assert counts is not None
    busy = max(counts, key=lambda task: counts[task])
    assert counts[busy] >= 3, counts
    project.cluster.run(
        "scontrol", "update", f"JobId={full_id}_{busy}", f"EndTime={end_time_in(1)}", check=True
    )
    project.cluster.wait_ended(full_id)
    cut = project.cluster.job_fields(f"{full_id}_{busy}")
    # The walltime's USR1 and TERM come at the same check: the task either drained and
    # exited 75 in time, or was still running at the TERM (TIMEOUT). Both go on.
    walltime_ends = cut["JobState"] == "TIMEOUT" or (cut["JobState"], cut["ExitCode"]) == (
        "FAILED",
        "75:0",
    )
    assert walltime_ends, cut
    other = project.cluster.job_fields(f"{full_id}_{1 - busy}")
    assert other["JobState"] == "COMPLETED", other
    done_before = {r["item_id"] for r in project.records() if r["verdict"] in TERMINAL}
    assert len(done_before) < 8

    dry = project.haico("continue", "demo", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert f"--array={busy} \\\n" in dry.stdout and "HAICO_SHARD_COUNT=2" in dry.stdout
    assert not list(project.campaign_dir.glob("submissions/*/continue-1"))

    # Rounds a minute apart: the rerun, then its tasks seen running or done, then done.
    loop = project.haico(
        "continue",
        "demo",
        "--until-done",
        "--every",
        "1",
        "--tasks",
        "2",
        "--time",
        "20",
        timeout=600,
    )
    assert loop.returncode == 0, loop.stdout + loop.stderr
    assert re.search(
        r"haico: until-done: submission \S+ finished in \d+ round\(s\)\n\Z", loop.stdout
    )
    assert "haico: nothing to continue: every share of submission" in loop.stdout
    [cont_id] = project.job_ids("continue-1")
    assert set(project.cluster.wait_ended(cont_id).values()) == {"COMPLETED"}
    [items_file] = project.campaign_dir.glob("submissions/*/continue-1/demo.work.items")
    owed = [line for line in items_file.read_text().splitlines() if not line.startswith("#")]
    assert len(owed) == 8 - len(done_before)

    records = project.records()
    terminal_once(project, 8)
    terminal = {r["item_id"] for r in records if r["verdict"] in TERMINAL}
    rerun = {
        r["item_id"]
        for r in records
        if r["slurm"]["array_job_id"] == cont_id and r["verdict"] in TERMINAL
    }
    assert rerun == terminal - done_before


def test_a_users_scancel_is_not_rerun_until_asked_and_then_only_what_it_owes(
    project: Project,
) -> None:
    work_items(project, count=6, turns=2, latency_ms=2000)
    full_id = smoke_then_full(project, tasks=1, time="10")

    def ran_one() -> bool:
        return any(r["slurm"]["array_job_id"] == full_id for r in project.records())

    wait_for(ran_one, timeout=120, what="the full job's first record")
    project.cluster.run("scancel", full_id, check=True)
    ends = project.cluster.wait_ended(full_id)
    assert set(ends.values()) == {"CANCELLED"}, ends
    owed = 6 - len({r["item_id"] for r in project.records() if r["verdict"] in TERMINAL})
    assert owed > 0

    held = project.haico("continue", "demo")
    assert held.returncode == 1, held.stdout + held.stderr
    assert re.search(
        rf"haico: full demo.work task 0 \(job {full_id}_0\): CANCELLED \S+, {owed} of \d+ items "
        rf"owed .*: cancelled \(scancel\), not rerun: --include-cancelled reruns its {owed} "
        "owed items",
        held.stdout,
    ), held.stdout
    assert "nothing to continue" not in held.stdout
    assert project.job_ids("continue-1") == []

    rerun = project.haico("continue", "demo", "--include-cancelled")
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert "rerun (round 2): cancelled, and --include-cancelled reruns it" in rerun.stdout
    [cont_id] = project.job_ids("continue-1")
    assert set(project.cluster.wait_ended(cont_id).values()) == {"COMPLETED"}
    terminal_once(project, 6)
    done = project.haico("continue", "demo")
    assert done.returncode == 0 and "nothing to continue" in done.stdout, done.stdout
