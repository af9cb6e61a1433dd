"""No orphans: services die with a pytest process killed by SIGKILL."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from pytest_haico.procfs import is_alive, iter_session
from pytest_haico.stack import is_port_free, reap_orphans
from tests.harness import start_pytest
from tests.polling import wait_for
from tests.stack.stack_helpers import TINY_SERVICE

CONFTEST = """
import json
import os
import sys
from pathlib import Path

import pytest

from pytest_haico.stack import HttpService, Orchestrator, PostgresService


@pytest.fixture(scope="session")
def stack():
    info = Path(os.environ["ORPHAN_INFO"])
    postgres = PostgresService()
    web = HttpService(
        name="web",
        argv=lambda port: [sys.executable, os.environ["TINY_SERVICE"], "--port", str(port)],
    )
    state = Path(os.environ["ORPHAN_STATE"])
    with Orchestrator([postgres, web], info.parent / "logs", state_dir=state) as stack:
        services = {n: [p.pid, p.port] for n, p in stack.processes.items()}
        tmp = info.with_suffix(".tmp")
        tmp.write_text(json.dumps({"services": services, "run_dir": str(postgres.run_dir)}))
        tmp.replace(info)
        yield stack
"""

TEST = """
import time


def test_blocks(stack):
    time.sleep(300)
"""


def test_services_die_with_a_pytest_killed_by_sigkill(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    pytester.makefile(".ini", pytest="[pytest]\n")
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_block=TEST)
    info = tmp_path / "info.json"
    state = tmp_path / "state"
    env = {"ORPHAN_INFO": str(info), "ORPHAN_STATE": str(state), "TINY_SERVICE": str(TINY_SERVICE)}
    run = start_pytest(
        pytester, "-q", "-p", "no:cacheprovider", log=tmp_path / "pytest.out", env=env
    )
    try:
        run.wait_for(info.exists, timeout=60, what="the inner session's healthy stack")
    finally:
        run.send_signal(signal.SIGKILL)
        run.wait(timeout=60)
    recorded = json.loads(info.read_text())
    services: dict[str, list[int]] = recorded["services"]
    assert set(services) == {"postgres", "web"}

    def all_gone() -> bool:
        return all(
            not is_alive(pid) and not any(True for _ in iter_session(pid)) and is_port_free(port)
            for pid, port in services.values()
        )

    wait_for(all_gone, timeout=15, what=f"every service and port of {services} to go")
    # What a SIGKILL leaves behind (the data directory, the registry) is the janitor's.
    run_dir = Path(recorded["run_dir"])
    assert run_dir.exists()
    reaped = {r.record.name: r for r in reap_orphans(state)}
    assert set(reaped) == {"postgres", "web"}
    # Both died with their owner: the janitor only removes the data directory.
    assert [(r.killed, r.refused) for r in reaped.values()] == [((), ()), ((), ())]
    assert reaped["postgres"].removed == (run_dir,)
    assert not run_dir.exists()
    assert list((state / "services").glob("*.json")) == []
