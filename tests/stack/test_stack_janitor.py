"""The janitor reaps services of dead owners, never touches live ones, and acts only on its own."""

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
from collections.abc import Callable
from pathlib import Path

import pytest

import pytest_haico
from pytest_haico.procfs import is_alive, read_proc_stat
from pytest_haico.stack import Orchestrator, Registry, ServiceRecord, reap_orphans
from tests.ledger.conftest import Mount, fill
from tests.polling import wait_for
from tests.stack.stack_helpers import (
    STACK_OWNER,
    give_to_nobody,
    needs_root,
    record_of,
    tiny,
    victim,
    write_registry,
)


def _ppid(pid: int) -> int:
    stat = read_proc_stat(pid)
    assert stat is not None, f"pid {pid} is gone"
    return stat.ppid


# Under umask 002 (usual with per-user groups) its files must still be private, or the
# janitor would no longer trust them.
@pytest.mark.parametrize("umask", [0o022, 0o002], ids=["umask-022", "umask-002"])
def test_janitor_reaps_the_services_of_a_killed_owner(tmp_path: Path, umask: int) -> None:
    # A directory the plugin made in $TMPDIR, as a service's cleanup path is.
    leftover = Path(tempfile.mkdtemp(prefix="pytest-haico-test-"))
    state = tmp_path / "state"
    owner = subprocess.Popen(
        [sys.executable, str(STACK_OWNER), "--out", str(tmp_path), "--state-dir", str(state),
         "--no-death-signal", "--cleanup", str(leftover)],
        stdin=subprocess.PIPE, umask=umask,
    )  # fmt: skip
    result_file = tmp_path / "result-0.json"
    wait_for(result_file.exists, timeout=30, what="the owner's stack")
    result = json.loads(result_file.read_text())
    owner.kill()
    owner.wait()
    assert owner.stdin is not None
    owner.stdin.close()  # its end of the pipe that held the stack
    # Once reparented, a parent-death signal would have been sent; without one the
    # service outlives its owner: the janitor's case.
    wait_for(lambda: _ppid(result["pid"]) != owner.pid, timeout=10, what="reparenting")
    assert is_alive(result["pid"])
    [registry] = (state / "services").glob(f"{result['owner']}-*.json")
    [claim] = (state / "ports").glob("*.json")
    assert [stat.S_IMODE(p.stat().st_mode) for p in (registry, claim)] == [0o600, 0o600]

    reaped = reap_orphans(state)

    assert [(r.record.name, r.record.pid, r.record.port) for r in reaped] == [
        ("web0", result["pid"], result["port"])
    ]
    assert [(r.killed, r.removed, r.refused) for r in reaped] == [
        ((result["pid"],), (leftover,), ())
    ]
    assert not is_alive(result["pid"])
    assert not registry.exists()
    assert not leftover.exists()
    assert list((state / "ports").glob("*.json")) == []
    assert reap_orphans(state) == []


def test_janitor_leaves_a_live_owners_services_alone(tmp_path: Path) -> None:
    with Orchestrator([tiny()], tmp_path / "logs", state_dir=tmp_path, reap=False) as stack:
        assert reap_orphans(tmp_path) == []
        assert is_alive(stack.processes["web"].pid or 0)
        assert len(list((tmp_path / "ports").glob("*.json"))) == 1


def test_a_full_results_disk_does_not_fail_a_services_stop(
    tmp_path: Path, tmpfs: Mount, caplog: pytest.LogCaptureFixture
) -> None:
    run_dir = tmpfs(tmp_path / "run")
    mirror = run_dir / "services.json"
    with Orchestrator(
        [tiny()], tmp_path / "logs", state_dir=tmp_path, reap=False, registry_mirror=mirror
    ) as stack:
        pid = stack.processes["web"].pid or 0
        fill(run_dir)
    # Stopped cleanly (no StackError), the node-local registry gone, the copy left as it was.
    assert not is_alive(pid)
    assert list((tmp_path / "services").glob("*.json")) == []
    assert f"{mirror} not updated: [Errno 28] No space left on device" in caplog.text


def test_janitor_does_not_kill_a_process_that_reused_a_recorded_pid(tmp_path: Path) -> None:
    me = read_proc_stat(os.getpid())
    assert me is not None
    # A dead owner recorded a service whose pid is now ours, with another start time.
    record = ServiceRecord(
        name="llm", pid=me.pid, pgid=me.pid, start_time=me.start_time - 1, uid=os.getuid()
    )
    registry = write_registry(tmp_path / "services" / "1.json", [record])
    [reaped] = reap_orphans(tmp_path)
    assert (reaped.record.name, reaped.killed, reaped.refused) == ("llm", (), ())
    assert is_alive(me.pid, me.start_time)  # and we are still here
    assert not registry.exists()


def test_janitor_spares_a_process_whose_uid_is_not_the_recorded_one(tmp_path: Path) -> None:
    with victim() as process:
        record = record_of(process, uid=os.getuid() + 1)
        write_registry(tmp_path / "services" / "1.json", [record])
        [reaped] = reap_orphans(tmp_path, timeout=1)
        assert reaped.killed == ()
        assert [re.sub(r"\d+", "N", r) for r in reaped.refused] == [
            "process N: pid N runs as uid N in group N, not as the recorded uid N in group N"
        ]
        assert is_alive(process.pid)


def _symlinked(services: Path, record: ServiceRecord) -> Path:
    target = write_registry(services.parent / "elsewhere" / "registry.json", [record])
    (services / "1.json").symlink_to(target)
    return services / "1.json"


def _another_users(services: Path, record: ServiceRecord) -> Path:
    registry = write_registry(services / "1.json", [record])
    give_to_nobody(registry)
    return registry


@pytest.mark.parametrize(
    "plant",
    [
        pytest.param(_symlinked, id="symlink"),
        pytest.param(_another_users, id="another-user", marks=needs_root),
    ],
)
def test_janitor_ignores_a_registry_file_that_is_not_its_own(
    tmp_path: Path, plant: Callable[[Path, ServiceRecord], Path]
) -> None:
    services = tmp_path / "services"
    services.mkdir(mode=0o700)
    with victim() as process:
        registry = plant(services, record_of(process))
        assert reap_orphans(tmp_path, timeout=1) == []
        assert is_alive(process.pid)
        assert os.path.lexists(registry)


def _outside(tmp_path: Path) -> Path:
    precious = tmp_path / "precious"
    precious.mkdir(mode=0o700)
    return precious


def _through_a_symlink(tmp_path: Path) -> Path:
    made = Path(tempfile.mkdtemp(prefix="pytest-haico-test-"))
    (tmp_path / "precious" / "inner").mkdir(parents=True)
    (made / "link").symlink_to(tmp_path / "precious")
    return made / "link" / "inner"


def _in_another_users_directory(tmp_path: Path) -> Path:
    theirs = Path(tempfile.mkdtemp(prefix="pytest-haico-test-"))
    give_to_nobody(theirs)
    return theirs


@pytest.mark.parametrize(
    "leftover",
    [
        pytest.param(_outside, id="not-made-by-the-plugin"),
        pytest.param(_through_a_symlink, id="through-a-symlink"),
        pytest.param(_in_another_users_directory, id="another-users", marks=needs_root),
    ],
)
def test_janitor_removes_only_paths_inside_directories_the_plugin_made(
    tmp_path: Path, leftover: Callable[[Path], Path]
) -> None:
    path = leftover(tmp_path)
    try:
        record = ServiceRecord(name="postgres", cleanup=(str(path),))
        write_registry(tmp_path / "state" / "services" / "1.json", [record])
        [reaped] = reap_orphans(tmp_path / "state")
        assert reaped.removed == ()
        assert [r.split(":")[0] for r in reaped.refused] == [str(path)]
        assert path.is_dir()
    finally:
        for made in Path(tempfile.gettempdir()).glob("pytest-haico-test-*"):
            if path.is_relative_to(made):
                shutil.rmtree(made)


# Run as pid 1 of a new PID namespace: were the janitor to signal process group 1
# (kill(-1): every process it may signal), only that namespace's processes would die.
_IN_A_PID_NAMESPACE = """
import json, subprocess, sys
from pathlib import Path
from pytest_haico.stack import ServiceRecord, reap_orphans
from pytest_haico.procfs import is_alive, read_proc_stat
from tests.stack.stack_helpers import record_of, write_registry

state = Path(sys.argv[1])
bystander = subprocess.Popen(["sleep", "60"], start_new_session=True)
init = read_proc_stat(1)
records = [
    record_of(bystander, "group-1", pgid=1),
    ServiceRecord(name="pid-1", pid=1, pgid=1, start_time=init.start_time, uid=0),
]
write_registry(state / "services" / "1.json", records)
reaped = reap_orphans(state, timeout=1)
refused = [list(getattr(r, "refused", ["(no refusal)"])) for r in reaped]
print(json.dumps({"alive": is_alive(bystander.pid), "refused": refused}))
"""


@needs_root
@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare (util-linux)")
def test_janitor_never_signals_process_group_1_or_pid_1(tmp_path: Path) -> None:
    root = Path(pytest_haico.__file__).parents[1]
    done = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc",
         sys.executable, "-c", _IN_A_PID_NAMESPACE, str(tmp_path)],
        cwd=root, env={**os.environ, "PYTHONPATH": str(root)},
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    result = json.loads(done.stdout)
    assert result["alive"] is True
    assert [[re.sub(r"\d+", "N", r) for r in refused] for refused in result["refused"]] == [
        ["process N: pid N / process group N is not a service's (≤ N)"]
    ] * 2


FAKE_CP = """#!/bin/sh
{cp} "$@" || exit $?
echo "fake-cp: copied, holding as pid $$"
exec sleep 300
"""


def test_an_owner_killed_during_the_postgres_copy_leaves_no_copy_and_no_data_directory(
    tmp_path: Path,
) -> None:
    # A cp that copies, then holds: the owner is killed while its copy helper runs.
    fake_bin = Path(tempfile.mkdtemp(prefix="haico-test-bin-"))  # the server's user runs it
    fake_bin.chmod(0o755)
    (fake_bin / "cp").write_text(FAKE_CP.format(cp=shutil.which("cp")))
    (fake_bin / "cp").chmod(0o755)
    state = tmp_path / "state"
    owner = subprocess.Popen(
        [sys.executable, str(STACK_OWNER), "--out", str(tmp_path), "--state-dir", str(state),
         "--postgres"],
        stdin=subprocess.PIPE, env={**os.environ, "PATH": f"{fake_bin}:{os.environ['PATH']}"},
    )  # fmt: skip
    log = tmp_path / "logs-0" / "postgres.log"
    holding = re.compile(r"fake-cp: copied, holding as pid (\d+)")
    helper: int | None = None
    data_dir: Path | None = None
    try:
        wait_for(
            lambda: log.exists() and holding.search(log.read_text()) is not None,
            timeout=60,
            what="the template copy",
        )
        text = log.read_text()
        helper = int(holding.findall(text)[-1])
        command = [line for line in text.splitlines() if f"{fake_bin}/cp " in line][-1]
        data_dir = Path(command.split()[-1])  # cp's destination
        assert (data_dir / "PG_VERSION").is_file()
        owner.send_signal(signal.SIGKILL)
        owner.wait()
        wait_for(lambda: not is_alive(helper or 0), timeout=10, what="the copy helper to die")

        reaped = reap_orphans(state)

        assert [(r.record.name, r.removed) for r in reaped] == [("postgres", (data_dir.parent,))]
        assert not data_dir.parent.exists()
    finally:
        owner.kill()
        owner.wait()
        assert owner.stdin is not None
        owner.stdin.close()
        if helper is not None and is_alive(helper):
            os.kill(helper, signal.SIGKILL)
        if data_dir is not None:
            shutil.rmtree(data_dir.parent, ignore_errors=True)
        shutil.rmtree(fake_bin)


def test_two_registries_of_one_process_keep_each_others_records(tmp_path: Path) -> None:
    """A process runs several stacks (an arm's, a test's own): closing one keeps the other's
    record, so the janitor still finds that stack's services if the process dies."""
    first, second = Registry(tmp_path), Registry(tmp_path)
    me = read_proc_stat(os.getpid())
    assert me is not None
    for registry, name in ((first, "web0"), (second, "web1")):
        registry.record(
            ServiceRecord(
                name=name, pid=os.getpid(), pgid=os.getpid(), start_time=me.start_time, uid=0
            )
        )
    assert first.path != second.path
    first.close()
    assert not first.path.exists()
    kept = json.loads(second.path.read_text())
    assert [s["name"] for s in kept["services"]] == ["web1"]
    second.close()
