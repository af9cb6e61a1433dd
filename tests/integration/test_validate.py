"""`haico validate` as a backend developer runs it: the selected items on a baseline and a
candidate build, on one model, compared; exit 1 on a regression, 0 without one."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_haico import procfs
from tests.harness import CONVERSATION_MODULE, CampaignProject
from tests.polling import wait_for
from tests.procs import tree

PYTHON = shlex.quote(sys.executable)
STANDIN = f"{PYTHON} -m pytest_haico.standins.backend --port {{port}}"
# The backend a developer works on: here the stand-in backend, run from the file of a build.
BACKEND = """\
import sys

from pytest_haico.standins import backend

sys.exit(backend.main())
"""
# The same with a bug: the agent's steps lose their artifacts.
BROKEN = """\
import sys

from pytest_haico.standins import backend, turns

step_event = turns.step_event
turns.step_event = lambda *args, **fields: step_event(*args, **{**fields, "artifact": None})
sys.exit(backend.main())
"""
SCRIPTS = """\
- id: plan-trip
  turns:
    - user: "Plan a three-day trip to Crete."
    - user: "Write it up as a document."
      expect: {artifact: true}
- id: greet
  turns:
    - user: "Hello! Who are you?"
"""


@pytest.fixture
def project(campaign: CampaignProject, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Arm demo and two scripts, in a $TMPDIR of its own (the kept stacks' state directory
    and the worktrees), removed after; a supervisor a failed test left is killed first."""
    tmpdir = Path(tempfile.mkdtemp(prefix="haico-validate-test-"))
    tmpdir.chmod(0o711)  # a Postgres run as another user (under root) reaches its data
    monkeypatch.setenv("TMPDIR", str(tmpdir))
    campaign.arm("demo")
    campaign.scripts("trip.yaml", SCRIPTS)
    campaign.write("test_conversations.py", CONVERSATION_MODULE)
    try:
        yield campaign.root
    finally:
        for path in tmpdir.glob("pytest-haico-*/stacks/*.json"):
            data = json.loads(path.read_text())
            if procfs.is_alive(data["supervisor_pid"], data["supervisor_start_time"]):
                os.kill(data["supervisor_pid"], signal.SIGKILL)
        shutil.rmtree(tmpdir, ignore_errors=True)


def _haico(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest_haico", *args],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=600,
    )


def _git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def _records(campaign_dir: Path) -> dict[str, list[dict[str, object]]]:
    """Each run's records, by run id."""
    return {
        ledger.stem: [json.loads(line) for line in ledger.read_text().splitlines()]
        for ledger in sorted((campaign_dir / "demo" / "ledger").glob("*.jsonl"))
    }


def test_a_candidate_that_loses_an_expectation_is_a_regression_and_exits_1(
    project: Path,
) -> None:
    backend = project / "backend"
    backend.mkdir()
    (backend / "broken.py").write_text(BROKEN)
    candidate = f"{PYTHON} broken.py --port {{port}}"
    result = _haico(
        project, "validate", "--backend-repo", str(backend), "--baseline", STANDIN,
        "--candidate", candidate, "--", "-k", "plan",
    )  # fmt: skip
    out = result.stdout
    assert result.returncode == 1, out + result.stderr
    lines = out.splitlines()
    (where,) = [line for line in lines if line.startswith("haico: validate: arm demo, campaign")]
    shown = where.rpartition(" ")[2]  # relative to the directory validate ran in
    campaign_dir = project / shown
    assert campaign_dir.parent == project / "results"
    assert campaign_dir.name.startswith("validate-")
    pytest.LineMatcher(lines).fnmatch_lines(
        [
            f"haico: starting the stack of arm demo (local profile); log: {shown}/demo/kept/*/"
            "supervisor.log",
            "haico: validate: one model for both runs: http://vllm.localhost:*/v1, the kept "
            "stack of arm demo (started for both runs); model identity "
            "endpoint:http://vllm.localhost:*/v1;served_name:demo",
            f"haico: validate: the baseline run: command {STANDIN!r} in {backend}",
            "*1 passed, 1 deselected*",
            f"haico: validate: the candidate run: command {candidate!r} in {backend}",
            "*1 failed, 1 deselected*",
            "haico: demo stack down in * s after * up; final dump *; no process left",
            "A: run * in */demo (1 items)",
            "B: run * in */demo (1 items)",
            "1 script × repeat on both sides; 0 only in A, 0 only in B",
            "regressions (completed in A, not in B): 1",
            "  demo plan-trip-r0  completed  expectation_failed  * [[]regression]",
            "expectation changes: 1 passed in A and fail in B, 0 failed in A and pass in B",
            "  demo plan-trip-r0 turn 2: expect artifact true: A pass → B FAIL (seen: no "
            "artifact in * steps)",
            "tokens out: A * → B *",
            "provenance: 2 run-config key(s) differ (ports, paths and job ids not compared)",
            f"  BACKEND_IDENTITY: A cmd:{STANDIN};git:none  →  B cmd:{candidate};git:none",
            f"  OPTION_BACKEND_CMD: A {STANDIN}  →  B {candidate}",
            "haico: validate: 1 regression(s) in the candidate: exit 1",
        ]
    )
    # Two runs, one item each: the baseline's and the candidate's, on one model.
    baseline, broken = _records(campaign_dir).values()
    assert [(r["script"], r["verdict"]) for r in baseline] == [("plan-trip", "completed")]
    assert [(r["script"], r["verdict"]) for r in broken] == [("plan-trip", "expectation_failed")]
    assert baseline[0]["model_identity"] == broken[0]["model_identity"]
    assert baseline[0]["item_id"] != broken[0]["item_id"]


def test_two_commits_without_a_regression_exit_0_on_a_kept_stacks_model(project: Path) -> None:
    repo = project / "backend"
    repo.mkdir()
    _git(repo, "init", "-q")
    _git(repo, "config", "user.email", "dev@example.org")
    _git(repo, "config", "user.name", "dev")
    (repo / "backend.py").write_text(BACKEND)
    _git(repo, "add", "backend.py")
    _git(repo, "commit", "-qm", "the backend")
    (repo / "backend.py").write_text("# a comment\n" + BACKEND)
    _git(repo, "commit", "-qam", "a comment")
    (repo / "backend.py").write_text(BROKEN)  # the developer's tree: an edit, not committed
    first, second = _git(repo, "rev-parse", "HEAD~1"), _git(repo, "rev-parse", "HEAD")

    up = _haico(project, "stack", "up", "demo")
    assert up.returncode == 0, up.stdout + up.stderr
    template = f"{PYTHON} backend.py --port {{port}}"
    result = _haico(
        project, "validate", "--attach", "demo", "--backend-repo", str(repo),
        "--backend-cmd", template, "--baseline", "HEAD~1", "--candidate", "HEAD",
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    pytest.LineMatcher(result.stdout.splitlines()).fnmatch_lines(
        [
            "haico: validate: one model for both runs: http://vllm.localhost:*/v1, the kept "
            "stack of arm demo (kept up by `haico stack up`); model identity *",
            f"haico: validate: the baseline run: commit {first[:12]} (HEAD~1) of backend, run "
            f"as {template!r}, checked out in */haico-validate-baseline-*/src",
            "*2 passed*",
            f"haico: validate: the candidate run: commit {second[:12]} (HEAD) of backend, run "
            f"as {template!r}, checked out in */haico-validate-candidate-*/src",
            "*2 passed*",
            "regressions (completed in A, not in B): 0",
            "expectation changes: 0 passed in A and fail in B, 0 failed in A and pass in B",
            f"  BACKEND_IDENTITY: A cmd:{template};git:{first}  →  B cmd:{template};git:{second}",
            "haico: validate: no regression in the candidate: exit 0",
        ]
    )
    assert "stack down" not in result.stdout  # the kept stack is not this command's
    # The developer's tree is as it was, and no worktree is left.
    assert (repo / "backend.py").read_text() == BROKEN
    assert _git(repo, "status", "--porcelain") == "M backend.py"
    assert _git(repo, "rev-parse", "HEAD") == second
    assert len(_git(repo, "worktree", "list").splitlines()) == 1
    assert not list(Path(os.environ["TMPDIR"]).glob("haico-validate-*"))
    assert _haico(project, "stack", "status", "demo").returncode == 0
    assert _haico(project, "stack", "down", "demo").returncode == 0


def test_a_run_that_does_not_finish_exits_75_and_an_empty_selection_2(project: Path) -> None:
    up = _haico(project, "stack", "up", "demo")
    assert up.returncode == 0, up.stdout + up.stderr
    attached = ("validate", "--attach", "demo", "--baseline", STANDIN)

    # A candidate that does not start: its run fails the backend's gate, nothing is compared.
    dead = f"{PYTHON} -c 'raise SystemExit(3)' --port {{port}}"
    result = _haico(project, *attached, "--candidate", dead)
    assert result.returncode == 75, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    pytest.LineMatcher(lines).fnmatch_lines(
        [
            "*2 passed*",
            "haico: validate: the candidate run did not finish (pytest exit 78: a gate failed); "
            "nothing compared; its records: */results/validate-*/demo",
        ]
    )
    assert not any(line.startswith("regressions") for line in lines)

    # A selection of no item: a usage error, before any comparison.
    empty = _haico(project, *attached, "--candidate", dead, "--", "-k", "no-such-item")
    assert empty.returncode == 2, empty.stdout + empty.stderr
    assert empty.stderr.splitlines()[-1] == (
        "haico: the baseline run recorded no item: pytest's arguments -k no-such-item select "
        "no item of arm demo"
    )

    # The kept stack serves another profile than the one asked for.
    other = _haico(project, *attached, "--candidate", dead, "--profile", "cluster")
    assert other.returncode == 2
    assert other.stderr.splitlines() == [
        f"haico: {Path(os.environ['TMPDIR'])}/pytest-haico-{os.getuid()}/stacks/demo.json keeps "
        "the local profile's stack, not the cluster profile's: give --profile local"
    ]
    # ... or another arm than the one asked for.
    (project / "experiments" / "arms" / "other.toml").write_text('description = "another arm"\n')
    other_arm = _haico(project, *attached, "--candidate", dead, "--arm", "other")
    assert other_arm.returncode == 2
    assert other_arm.stderr.splitlines()[-1].endswith(
        "/stacks/demo.json keeps arm demo, not arm other: give --arm demo, or attach to a stack "
        "of arm other"
    )
    assert _haico(project, "stack", "down", "demo").returncode == 0


# The baseline of the SIGTERM test: the stand-in backend, holding a turn that asks it to.
HOLDING = """\
import asyncio
import sys

from pytest_haico.standins import backend, backend_app

plan_turn = backend_app.plan_turn


async def holding(request, **kwargs):
    if "Please hold" in request.query:  # until the run is stopped
        await asyncio.sleep(3600)
    return await plan_turn(request, **kwargs)


backend_app.plan_turn = holding
sys.exit(backend.main())
"""
TEMPLATE = f"{PYTHON} backend.py --port {{port}}"
HOLD_SCRIPT = """\
- id: wait
  turns:
    - user: "Please hold."
"""


def test_a_sigterm_while_the_first_run_converses_ends_everything_with_75_and_one_line(
    project: Path,
) -> None:
    (project / "experiments" / "arms" / "demo.toml").write_text("[run]\nconcurrency = 2\n")
    (project / "experiments" / "scripts" / "wait.yaml").write_text(HOLD_SCRIPT)
    repo = project / "backend"
    repo.mkdir()
    _git(repo, "init", "-q")
    _git(repo, "config", "user.email", "dev@example.org")
    _git(repo, "config", "user.name", "dev")
    (repo / "backend.py").write_text(HOLDING)
    _git(repo, "add", "backend.py")
    _git(repo, "commit", "-qm", "a backend that holds")
    (repo / "backend.py").write_text(BACKEND)
    _git(repo, "commit", "-qam", "the backend")
    tmpdir = Path(os.environ["TMPDIR"])
    out = project / "validate.out"
    with out.open("wb") as sink:
        validate = subprocess.Popen(
            [
                sys.executable, "-m", "pytest_haico", "validate", "--campaign", "held",
                "--backend-repo", str(repo), "--backend-cmd", TEMPLATE, "--baseline", "HEAD~1",
                "--candidate", "HEAD", "--", "-k", "greet or wait",
            ],
            cwd=project, stdout=sink, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        ledgers = project / "results" / "held" / "demo" / "ledger"

        def recorded() -> bool:
            return any(path.read_text() for path in ledgers.glob("*.jsonl"))

        wait_for(recorded, timeout=300, what="the baseline run's first record")
        kept = json.loads((tmpdir / f"pytest-haico-{os.getuid()}/stacks/demo.json").read_text())
        started = tree([validate.pid]) - {validate.pid}  # the run, its services
        commands = [_cmdline(pid) for pid in started]
        validate.send_signal(signal.SIGTERM)
        status = validate.wait(timeout=300)
    finally:
        if validate.poll() is None:
            validate.kill()
            validate.wait()
    output = out.read_text()
    assert status == 75, output
    # One line of its own: what stopped it, where the records are, what to rerun.
    (line,) = [line for line in output.splitlines() if "validate: stopped" in line]
    assert line == (
        "haico: validate: stopped by SIGTERM during the baseline run (exit 75): nothing "
        f"compared; its records: {project}/results/held/demo; rerun the same command for a "
        "new validation (another --campaign if it names one)"
    )
    assert "Traceback" not in output
    # The baseline's pytest got the signal and ended its conversations, its stack with it.
    assert any(b"--haico-backend-cmd" in command for command in commands), commands
    assert "terminated (exit 75): SIGTERM" in output
    assert tree(started) == set(), output
    # The stack it started for both runs is down, nothing of it is left.
    kept_pids = [(kept["supervisor_pid"], kept["supervisor_start_time"])]
    kept_pids += [(s["pid"], s["start_time"]) for s in kept["services"]]
    assert not [pid for pid, start in kept_pids if procfs.is_alive(pid, start)], output
    # The commit's worktree is gone; the completed record is kept, the held one interrupted.
    assert len(_git(repo, "worktree", "list").splitlines()) == 1
    assert not list(tmpdir.glob("haico-validate-*"))
    (baseline,) = _records(project / "results" / "held").values()
    verdicts = {r["script"]: r["verdict"] for r in baseline}
    assert verdicts["greet"] == "completed"
    assert verdicts.get("wait", "interrupted") == "interrupted"


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""
