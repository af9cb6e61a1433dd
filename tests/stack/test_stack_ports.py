"""Port derivation, claims, stale claims, and two sessions racing for one job's ports."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pytest_haico.errors import StackError
from pytest_haico.procfs import is_alive
from pytest_haico.stack import PortPool, derive_base_port, is_port_free, reap_stale_claims
from pytest_haico.stack.ports import PORT_HIGH, PORT_LOW, PortClaim
from tests.polling import wait_for
from tests.stack.stack_helpers import STACK_OWNER


def test_base_port_is_stable_per_job_and_below_the_ephemeral_range() -> None:
    job = {"SLURM_JOB_ID": "4242"}
    assert derive_base_port(job) == derive_base_port(dict(job))
    neighbours = {derive_base_port({"SLURM_JOB_ID": str(n)}) for n in range(4242, 4250)}
    assert len(neighbours) == 8
    task = derive_base_port({"SLURM_JOB_ID": "4242", "SLURM_ARRAY_TASK_ID": "3"})
    assert task != derive_base_port(job)
    for base in [*neighbours, task, derive_base_port({}), derive_base_port({"SLURM_JOB_ID": "x"})]:
        assert PORT_LOW <= base < PORT_HIGH < 32768


def _squat_a_base(squatter: socket.socket, state_dir: Path) -> tuple[str, PortPool]:
    """Bind `squatter` to the base port of a job id whose base nobody else holds (tests
    beside this one listen on loopback too): that job id and a pool of it."""
    for job in range(777, 777 + 100):
        pool = PortPool(state_dir, env={"SLURM_JOB_ID": str(job)})
        try:
            squatter.bind(("127.0.0.1", pool.base))
        except OSError:
            continue
        return str(job), pool
    raise AssertionError("100 neighbouring base ports are all in use")


def test_claim_skips_bound_and_claimed_ports_and_releases(tmp_path: Path) -> None:
    with socket.socket() as squatter:
        job, first = _squat_a_base(squatter, tmp_path)
        second = PortPool(tmp_path, env={"SLURM_JOB_ID": job})
        squatter.listen()
        a = first.claim("a")
        b = second.claim("b")
        assert first.base not in (a, b) and a != b
        claim = PortClaim.model_validate_json((tmp_path / "ports" / f"{a}.json").read_text())
        assert (claim.port, claim.job, claim.pid, claim.service) == (a, job, os.getpid(), "a")
        first.release(a)
        assert not (tmp_path / "ports" / f"{a}.json").exists()
        assert second.claim("c") == a
    second.release_all()
    assert list((tmp_path / "ports").glob("*.json")) == []


def _pool_with_a_free_base(state_dir: Path) -> PortPool:
    """A pool whose base port nobody listens on now (the job id picks the base)."""
    for job in range(778, 778 + 100):
        pool = PortPool(state_dir, env={"SLURM_JOB_ID": str(job)})
        if is_port_free(pool.base):
            return pool
    raise AssertionError("100 neighbouring base ports are all in use")


def test_claim_of_a_dead_process_is_stale_and_reclaimed(tmp_path: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    pool = _pool_with_a_free_base(tmp_path)
    stale = PortClaim(
        port=pool.base,
        host=socket.gethostname(),
        job="old",
        pid=dead.pid,
        pid_start_time=None,
        service="llm",
        claimed_at=time.time(),
    )
    (tmp_path / "ports").mkdir()
    (tmp_path / "ports" / f"{pool.base}.json").write_text(stale.model_dump_json())
    assert pool.claim("llm") == pool.base
    pool.release_all()
    (tmp_path / "ports" / f"{pool.base}.json").write_text(stale.model_dump_json())
    assert [c.pid for c in reap_stale_claims(tmp_path)] == [dead.pid]


def _stale_claim(port: int) -> str:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    claim = PortClaim(
        port=port,
        host=socket.gethostname(),
        job="old",
        pid=dead.pid,
        pid_start_time=None,
        service="llm",
        claimed_at=time.time(),
    )
    return claim.model_dump_json()


def test_port_claims_refuse_a_state_directory_writable_by_others(tmp_path: Path) -> None:
    state = tmp_path / "state"
    (state / "ports").mkdir(parents=True)
    (state / "ports" / "20000.json").write_text(_stale_claim(20000))
    state.chmod(0o777)
    problem = f"^the pytest-haico state directory {state} is writable by group and others"
    with pytest.raises(StackError, match=problem):
        PortPool(state).claim("llm")
    with pytest.raises(StackError, match=problem):
        reap_stale_claims(state)
    assert (state / "ports" / "20000.json").exists()


def test_a_claim_file_that_is_a_symlink_is_neither_trusted_nor_removed(tmp_path: Path) -> None:
    pool = _pool_with_a_free_base(tmp_path)
    # A stale claim on the base port, reached through a symlink: not ours to judge.
    (tmp_path / "elsewhere.json").write_text(_stale_claim(pool.base))
    (tmp_path / "ports").mkdir(mode=0o700)
    link = tmp_path / "ports" / f"{pool.base}.json"
    link.symlink_to(tmp_path / "elsewhere.json")
    try:
        assert pool.claim("llm") != pool.base
        assert reap_stale_claims(tmp_path) == []
        assert link.is_symlink()
    finally:
        pool.release_all()


def test_two_sessions_of_the_same_job_started_at_once_get_different_ports(
    tmp_path: Path,
) -> None:
    owners = [
        subprocess.Popen(
            [sys.executable, str(STACK_OWNER), "--out", str(tmp_path), "--state-dir",
             str(tmp_path / "state"), "--id", str(i), "--job", "31337", "--barrier"],
            stdin=subprocess.PIPE,
        )
        for i in (1, 2)
    ]  # fmt: skip
    try:
        wait_for(
            lambda: all((tmp_path / f"ready-{i}").exists() for i in (1, 2)),
            timeout=30,
            what="both sessions at the barrier",
        )
        (tmp_path / "go").touch()
        wait_for(
            lambda: all((tmp_path / f"result-{i}.json").exists() for i in (1, 2)),
            timeout=30,
            what="both sessions started",
        )
        results = [json.loads((tmp_path / f"result-{i}.json").read_text()) for i in (1, 2)]
        assert [r.get("error") for r in results] == [None, None]
        assert results[0]["base"] == results[1]["base"]
        assert results[0]["port"] != results[1]["port"]
        # The claims kept them apart; neither had to retry after a failed bind.
        assert [r["attempts"] for r in results] == [1, 1]
        assert all(is_alive(r["pid"]) for r in results)
    finally:
        for owner in owners:
            assert owner.stdin is not None
            owner.stdin.close()
        for owner in owners:
            assert owner.wait(timeout=30) == 0


def test_is_port_free_sees_a_listener() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        assert not is_port_free(sock.getsockname()[1])
