"""The janitor reaps services of dead owners and never touches live ones."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from pytest_haico.stack import Orchestrator, ServiceRecord, reap_orphans
from pytest_haico.stack.janitor import RegistryFile
from pytest_haico.stack.service import is_alive, read_proc_stat
from tests.stack.stack_helpers import STACK_OWNER, tiny, wait_until


def _ppid(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2 :].split()[1])


def test_janitor_reaps_the_services_of_a_killed_owner(tmp_path: Path) -> None:
    leftover = tmp_path / "leftover"
    leftover.mkdir()
    state = tmp_path / "state"
    owner = subprocess.Popen(
        [sys.executable, str(STACK_OWNER), "--out", str(tmp_path), "--state-dir", str(state),
         "--no-death-signal", "--cleanup", str(leftover)],
        stdin=subprocess.PIPE,
    )  # fmt: skip
    result_file = tmp_path / "result-0.json"
    wait_until(result_file.exists, timeout=30, what="the owner's stack")
    result = json.loads(result_file.read_text())
    owner.kill()
    owner.wait()
    # Once reparented, a parent-death signal would have been sent; without one the
    # service outlives its owner: the janitor's case.
    wait_until(lambda: _ppid(result["pid"]) != owner.pid, timeout=10, what="reparenting")
    assert is_alive(result["pid"])
    registry = state / "services" / f"{result['owner']}.json"
    assert registry.exists()

    reaped = reap_orphans(state)

    assert [(r.name, r.pid, r.port) for r in reaped] == [("web0", result["pid"], result["port"])]
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


def test_janitor_does_not_kill_a_process_that_reused_a_recorded_pid(tmp_path: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    me = read_proc_stat(os.getpid())
    assert me is not None
    # A dead owner recorded a service whose pid is now ours, with another start time.
    record = ServiceRecord(name="llm", pid=os.getpid(), pgid=me.sid, start_time=me.start_time - 1)
    registry = RegistryFile(
        host=socket.gethostname(),
        owner_pid=dead.pid,
        owner_start_time=None,
        updated_at=time.time(),
        services=[record],
    )
    (tmp_path / "services").mkdir()
    (tmp_path / "services" / f"{dead.pid}.json").write_text(registry.model_dump_json())
    assert [r.name for r in reap_orphans(tmp_path)] == ["llm"]  # and we are still here
    assert not (tmp_path / "services" / f"{dead.pid}.json").exists()
