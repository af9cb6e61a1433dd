"""`haico stack up|status|down` and `pytest --haico-attach`: one kept stack serves several
runs without a restart, dies with its supervisor, and refuses what it does not serve."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from filelock import FileLock

from pytest_haico import procfs
from pytest_haico.stack.ports import is_port_free
from tests.harness import CONVERSATION_MODULE, CampaignProject
from tests.polling import wait_for


class KeptProject:
    """A campaign project with arm demo and the `haico` command, in a $TMPDIR of its own
    (so its state directory is this test's)."""

    def __init__(self, campaign: CampaignProject, tmpdir: Path) -> None:
        self.campaign = campaign
        self.tmpdir = tmpdir

    @property
    def stacks(self) -> Path:
        return self.tmpdir / f"pytest-haico-{os.getuid()}" / "stacks"

    def haico(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "pytest_haico", *args],
            cwd=self.campaign.root,
            capture_output=True,
            text=True,
            timeout=300,
        )

    def up(self, *options: str) -> Path:
        """`haico stack up demo`; the state file it names."""
        result = self.haico("stack", "up", "demo", *options)
        assert result.returncode == 0, result.stdout + result.stderr
        [line] = [line for line in result.stdout.splitlines() if "state file" in line]
        return Path(line.rsplit(" ", 1)[1])

    def attached(self, state: Path, *args: str) -> pytest.RunResult:
        return self.campaign.run_subprocess("--haico-attach", str(state), *args)

    def kill_supervisors(self) -> None:
        for path in self.stacks.glob("*.json"):
            data = json.loads(path.read_text())
            if "supervisor_pid" in data and procfs.is_alive(
                data["supervisor_pid"], data["supervisor_start_time"]
            ):
                os.kill(data["supervisor_pid"], signal.SIGKILL)


@pytest.fixture
def kept(campaign: CampaignProject, monkeypatch: pytest.MonkeyPatch) -> Iterator[KeptProject]:
    # Outside pytest's 0700 base: a Postgres run as another user (under root) reaches its
    # data in $TMPDIR by name.
    tmpdir = Path(tempfile.mkdtemp(prefix="haico-kept-test-"))
    tmpdir.chmod(0o711)
    monkeypatch.setenv("TMPDIR", str(tmpdir))
    campaign.arm("demo")
    campaign.simple_scripts("a", "b")
    campaign.write("test_conversations.py", CONVERSATION_MODULE)
    project = KeptProject(campaign, tmpdir)
    try:
        yield project
    finally:
        project.kill_supervisors()
        shutil.rmtree(tmpdir, ignore_errors=True)


def _processes(state: Path) -> dict[str, tuple[int, int]]:
    """name -> (pid, start time) of the supervisor and every service the state file names."""
    data = json.loads(state.read_text())
    found = {"supervisor": (data["supervisor_pid"], data["supervisor_start_time"])}
    found.update({s["name"]: (s["pid"], s["start_time"]) for s in data["services"]})
    return found


def _run_dirs(campaign: CampaignProject) -> list[Path]:
    return sorted((campaign.arm_dir("demo") / "runs").iterdir())


def test_two_runs_use_one_kept_stack_that_only_down_stops(kept: KeptProject) -> None:
    campaign = kept.campaign
    state = kept.up("--dump-interval", "1")
    assert stat.S_IMODE(state.stat().st_mode) == 0o600
    assert stat.S_IMODE(state.parent.stat().st_mode) == 0o700
    before = _processes(state)
    assert set(before) == {"supervisor", "llm", "postgres", "backend"}
    # No secret in any argv a co-tenant can read in /proc.
    secrets = json.loads(state.read_text())["secrets"]
    for pid, _ in before.values():
        argv = Path(f"/proc/{pid}/cmdline").read_text()
        assert not any(secret in argv for secret in secrets), pid

    first = kept.attached(state)
    assert first.ret == 0, first.stdout.str()
    first.stdout.fnmatch_lines(["haico: demo attached to the kept stack, gates passed in *"])
    # A change to the scripts between the runs: the next run runs what is new (resume).
    campaign.simple_scripts("c")
    second = kept.attached(state)
    assert second.ret == 0, second.stdout.str()
    second.stdout.fnmatch_lines(["haico: 2 done in ledger, 1 to run (0 retries)"])
    third = kept.attached(state, "--haico-no-resume", "-k", "b")
    assert third.ret == 0, third.stdout.str()
    third.stdout.fnmatch_lines(["*1 passed, 2 deselected*"])

    # The same processes throughout: nothing restarted, nothing stopped.
    assert all(procfs.is_alive(pid, start) for pid, start in before.values())
    assert _processes(state) == before
    records = campaign.records("demo")
    assert sorted(r["script"] for r in records) == ["a", "b", "b", "c"]
    assert {r["verdict"] for r in records} == {"completed"}
    # Each run has its own ledger and run directory; none started or dumped a stack.
    assert len(campaign.ledger_files("demo")) == 3
    runs = _run_dirs(campaign)
    assert len(runs) == 3
    assert not any((run / "dumps").exists() or (run / "services.json").exists() for run in runs)
    kept_dir = json.loads(state.read_text())["directory"]
    assert all(f"KEPT_STACK={kept_dir}" in (run / "run-config.env").read_text() for run in runs)

    # The supervisor's periodic dumps, every second here (each replaces the one before).
    def periodic() -> list[str]:
        return [path.name for path in Path(kept_dir, "dumps").glob("periodic-*.dump")]

    wait_for(lambda: len(periodic()) == 1, timeout=30, what="a periodic dump")
    newest = periodic()
    wait_for(lambda: periodic() not in ([], newest), timeout=30, what="the next periodic dump")

    status = kept.haico("stack", "status", "demo")
    assert status.returncode == 0, status.stdout + status.stderr
    lines = status.stdout.splitlines()
    assert lines[0].startswith("demo: local profile, up since ")
    for name in ("llm", "postgres", "backend"):
        pid, _ = before[name]
        [line] = [line for line in lines if line.strip().startswith(f"{name} ")]
        assert f"pid {pid}" in line and "healthy (" in line, line
    assert any("serves vllm:" in line and "max_model_len=8192" in line for line in lines)

    ports = [s["port"] for s in json.loads(state.read_text())["services"]]
    down = kept.haico("stack", "down", "demo")
    assert down.returncode == 0, down.stdout + down.stderr
    assert "final dump" in down.stdout and "no process left" in down.stdout
    assert not any(procfs.is_alive(pid) for pid, _ in before.values())
    assert all(is_port_free(port) for port in ports)
    assert not state.exists()
    assert len(list((Path(kept_dir) / "dumps").glob("final-*.dump"))) == 1
    # An attached run started no stack: its start-up is no measure of one.
    report = kept.haico("report", str(campaign.root / "results" / "default"))
    assert report.returncode == 0, report.stderr
    assert "stack start-up, demo: not measured (no run that started its own stack" in report.stdout


def test_stack_up_campaign_puts_the_logs_and_the_attached_runs_results_in_one_campaign(
    kept: KeptProject,
) -> None:
    campaign = kept.campaign
    result = kept.haico("stack", "up", "demo", "--campaign", "trial")
    assert result.returncode == 0, result.stdout + result.stderr
    state = kept.stacks / "demo.json"
    assert f"haico: next: pytest experiments --haico-attach {state} --haico-campaign trial" in (
        result.stdout.splitlines()
    )
    results = campaign.root / "results"
    [kept_dir] = (results / "trial" / "demo" / "kept").iterdir()
    assert json.loads(state.read_text())["directory"] == str(kept_dir)

    together = kept.attached(state, "--haico-campaign", "trial")
    assert together.ret == 0, together.stdout.str()
    assert "the kept stack's logs and dumps are in" not in together.stdout.str()
    assert len(list((results / "trial" / "demo" / "ledger").iterdir())) == 1
    # A run that forgets the campaign is told where the stack's logs are, and how to join.
    apart = kept.attached(state)
    assert apart.ret == 0, apart.stdout.str()
    apart.stdout.fnmatch_lines(
        [
            f"haico: the kept stack's logs and dumps are in {results / 'trial'}, this run's "
            f"results in {results / 'default'}: pass --haico-campaign trial (and "
            f"--haico-results {results}) to keep them in one campaign"
        ]
    )
    assert kept.haico("stack", "down", "demo").returncode == 0


def test_a_killed_supervisor_takes_its_services_and_leaves_a_gone_stack(
    kept: KeptProject,
) -> None:
    state = kept.up()
    processes = _processes(state)
    supervisor, _ = processes.pop("supervisor")
    os.kill(supervisor, signal.SIGKILL)
    wait_for(
        lambda: not any(procfs.is_alive(pid) for pid, _ in processes.values()),
        timeout=10,
        what="the services to die with their supervisor",
    )

    listing = kept.haico("stack", "status")  # every stack kept up: this one is gone
    assert listing.returncode == 1
    [line] = listing.stdout.splitlines()
    assert line.startswith(f"haico: {state}: the kept stack of arm demo is gone"), line
    for args in (("stack", "status", str(state)), ("stack", "down", "demo")):
        result = kept.haico(*args)
        assert result.returncode == 2
        [line] = result.stderr.splitlines()
        assert "the kept stack of arm demo is gone" in line, line
        assert "haico stack up demo" in line
    attached = kept.attached(state)  # `down` removed the stale state file
    assert attached.ret == pytest.ExitCode.USAGE_ERROR
    attached.stderr.fnmatch_lines(["ERROR: haico: --haico-attach *: no such state file; *"])
    assert kept.campaign.records("demo") == []

    again = kept.up()  # a new stack for the same arm
    assert _processes(again)["supervisor"][0] != supervisor
    assert kept.haico("stack", "down", "demo").returncode == 0


def test_an_arm_edit_is_refused_only_when_it_changes_what_the_stack_serves(
    kept: KeptProject,
) -> None:
    campaign = kept.campaign
    state = kept.up()
    campaign.arm("demo", "[vllm]\nmax_model_len = 4096\n")
    refused = kept.attached(state)
    assert refused.ret == pytest.ExitCode.USAGE_ERROR
    [line] = [line for line in refused.stderr.lines if line.strip()]
    assert "changed what the kept stack serves" in line
    assert "vllm.max_model_len: 8192 -> 4096" in line
    assert "haico stack down demo" in line
    assert campaign.records("demo") == []

    campaign.arm("demo", "[generation]\ntemperature = 0.5\n")  # a request setting
    accepted = kept.attached(state)
    assert accepted.ret == 0, accepted.stdout.str()
    records = campaign.records("demo")
    assert len(records) == 2
    assert {r["settings"]["generation"]["temperature"] for r in records} == {0.5}
    assert kept.haico("stack", "down", "demo").returncode == 0


def test_an_attached_run_ended_by_sigterm_leaves_the_stack_running(kept: KeptProject) -> None:
    campaign = kept.campaign
    campaign.arm("demo", "[standin]\nlatency_ms = 2000\n")
    state = kept.up()
    before = _processes(state)
    run = campaign.start("--haico-attach", str(state))
    transcripts = campaign.arm_dir("demo") / "transcripts"
    run.wait_for(
        lambda: any(transcripts.glob("*.jsonl")), timeout=60, what="a conversation in flight"
    )
    run.send_signal(signal.SIGTERM)
    assert run.wait(timeout=60) == 75, run.output()
    assert {r["verdict"] for r in campaign.records("demo")} <= {"interrupted", "completed"}
    assert all(procfs.is_alive(pid, start) for pid, start in before.values())
    status = kept.haico("stack", "status", "demo")
    assert status.returncode == 0, status.stdout + status.stderr
    assert kept.haico("stack", "down", "demo").returncode == 0


def test_a_state_file_planted_by_another_user_is_refused(kept: KeptProject) -> None:
    if os.geteuid() != 0:
        pytest.skip("planting a file of another user takes root (CI runs as root)")
    assert kept.haico("stack", "status").returncode == 0  # makes the stacks' directory
    planted = kept.stacks / "demo.json"
    planted.write_text("{}")
    os.chown(planted, 65534, 65534)
    for args in (("stack", "status", "demo"), ("stack", "down", "demo"), ("stack", "up", "demo")):
        result = kept.haico(*args)
        assert result.returncode == 2, args
        [line] = result.stderr.splitlines()
        assert f"{planted} is owned by uid 65534" in line, line
    attached = kept.attached(planted)
    assert attached.ret == pytest.ExitCode.USAGE_ERROR
    attached.stderr.fnmatch_lines([f"ERROR: haico: --haico-attach {planted} is owned by uid*"])


def test_a_file_that_is_no_state_file_is_one_line_of_error(kept: KeptProject) -> None:
    other = kept.campaign.root / "notes.json"
    other.write_text('{"arm": "demo"}')
    result = kept.haico("stack", "status", str(other))
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"haico: {other} is not a state file of `haico stack up` (version 1): give the file "
        "`haico stack up` printed"
    ]
    unknown = kept.haico("stack", "up", "nope")
    assert unknown.returncode == 2
    assert unknown.stderr.splitlines() == [
        f"haico: {kept.campaign.experiments}/arms/nope.toml: no such arm file; the arms under "
        f"{kept.campaign.experiments}: demo"
    ]


def test_a_second_up_while_one_starts_the_same_arm_is_refused(kept: KeptProject) -> None:
    assert kept.haico("stack", "status").returncode == 0  # makes the stacks' directory
    with FileLock(kept.stacks / "demo.lock"):  # what a `haico stack up demo` under way holds
        result = kept.haico("stack", "up", "demo")
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "haico: another `haico stack up demo` is starting the stack of arm demo: wait for it, "
        "then attach to its stack"
    ]
    assert not (kept.campaign.arm_dir("demo") / "kept").exists()


def test_a_service_that_dies_ends_the_kept_stack_after_a_final_dump(kept: KeptProject) -> None:
    state = kept.up()
    processes = _processes(state)
    directory = Path(json.loads(state.read_text())["directory"])
    os.kill(processes["backend"][0], signal.SIGKILL)
    wait_for(
        lambda: not any(procfs.is_alive(pid, start) for pid, start in processes.values()),
        timeout=30,
        what="the supervisor to stop its stack",
    )
    assert not state.exists()
    log = (directory / "supervisor.log").read_text()
    assert f"stopping: backend (pid {processes['backend'][0]}) ended with status -9" in log, log
    assert len(list((directory / "dumps").glob("final-*.dump"))) == 1  # Postgres was still up
    status = kept.haico("stack", "status", "demo")
    assert status.returncode == 2
    assert "no such state file" in status.stderr


def test_ctrl_c_of_up_while_the_stack_starts_leaves_no_process(kept: KeptProject) -> None:
    kept.campaign.arm("demo", "[standin]\nload_s = 30\n")  # the model loads for 30 s
    up = subprocess.Popen(
        [sys.executable, "-m", "pytest_haico", "stack", "up", "demo"],
        cwd=kept.campaign.root,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # A shell at a terminal, whatever this pytest inherited (a background job's is ignored).
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert up.stdout is not None
    for line in up.stdout:  # `up` shows the services' start-up as the supervisor logs it
        if "llm: spawned pid" in line:
            break
    up.send_signal(signal.SIGINT)
    out, err = up.communicate(timeout=60)
    assert up.returncode == 130, out + err
    assert err.splitlines() == ["haico: interrupted"]
    [log] = kept.campaign.arm_dir("demo").glob("kept/*/supervisor.log")
    supervisor_lines = log.read_text()
    assert "SIGTERM: stopping" in supervisor_lines
    assert "the stack did not start" in supervisor_lines
    spawned = [int(pid) for pid in re.findall(r": spawned pid (\d+) on port", supervisor_lines)]
    assert spawned
    wait_for(
        lambda: not any(procfs.is_alive(pid) for pid in spawned), timeout=10, what="every service"
    )
    assert not (kept.stacks / "demo.json").exists()
