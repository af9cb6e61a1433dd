"""The stack through the plugin: fixtures, once per arm, and nothing left running afterwards."""

from __future__ import annotations

import json
import shlex
import signal
import socket
import sys
from functools import partial
from pathlib import Path

import pytest

from pytest_haico.procfs import is_alive
from tests.harness import CONVERSATION_MODULE, CampaignProject
from tests.polling import wait_for

HAND_WRITTEN = """
import json
import os
from pathlib import Path

import psycopg
import pytest

SEEN = Path(os.environ["HAICO_TEST_SEEN"])


def note(stack):
    services = json.loads((stack.log_paths["backend"].parent.parent / "services.json").read_text())
    pids = {s["name"]: s["pid"] for s in services["services"]}
    with SEEN.open("a") as handle:
        handle.write(json.dumps({"ports": stack.ports, "pids": pids}) + "\\n")


def test_stack_exposes_urls_logs_and_a_read_only_dsn(haico_stack):
    note(haico_stack)
    assert haico_stack.backend_url.startswith("http://127.0.0.1:")
    assert haico_stack.model_endpoint.startswith("http://vllm.localhost:")
    assert set(haico_stack.log_paths) == {"postgres", "llm", "backend"}
    assert all(path.is_file() for path in haico_stack.log_paths.values())
    assert haico_stack.admin_token not in repr(haico_stack)
    with psycopg.connect(haico_stack.readonly_dsn, autocommit=True) as connection:
        assert connection.execute("select count(*) from workspace_snapshots").fetchone()
        with pytest.raises(psycopg.Error):
            connection.execute("create table intruder (i int)")


@pytest.mark.asyncio
async def test_client_is_authenticated(haico_client):
    response = await haico_client.get("/api/health")
    assert response.status_code == 200


def test_a_failing_test(haico_stack):
    note(haico_stack)
    assert False, "fails on purpose"


@pytest.fixture
def broken(haico_stack):
    raise RuntimeError("a fixture raises on purpose")


def test_a_raising_fixture(broken):
    pass


def test_last(haico_stack):
    note(haico_stack)
"""


def port_is_free(port: int) -> bool:
    """Free for a new server: bindable with SO_REUSEADDR, as servers bind (TIME_WAIT is no
    leak)."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def test_stack_starts_once_stops_once_despite_failures(
    campaign: CampaignProject, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    campaign.arm("demo")
    campaign.scripts("a.yaml", "id: a\nturns:\n  - user: hi\n")
    (campaign.experiments / "test_conversations.py").unlink()
    campaign.write("test_stack.py", HAND_WRITTEN)
    seen = tmp_path / "seen.jsonl"
    monkeypatch.setenv("HAICO_TEST_SEEN", str(seen))
    result = campaign.run_subprocess("experiments/test_stack.py", "-rA")
    assert "1 failed, 3 passed, 1 error" in result.stdout.str(), result.stdout.str()
    notes = [json.loads(line) for line in seen.read_text().splitlines()]
    assert len(notes) == 3 and all(note == notes[0] for note in notes)  # one stack, reused
    for pid in notes[0]["pids"].values():
        wait_for(partial(_exited, pid), timeout=15, what=f"pid {pid} to exit")
    for port in notes[0]["ports"].values():
        wait_for(partial(port_is_free, port), timeout=15, what=f"port {port} free")
    logs = next((campaign.arm_dir("demo") / "runs").iterdir()) / "logs"
    postgres_log = (logs / "postgres.log").read_text()
    assert postgres_log.count("database system is ready to accept connections") == 1
    assert postgres_log.count("database system is shut down") == 1


BLOCKING = """
import json, os, time
from pathlib import Path

def test_blocks(haico_stack):
    services = json.loads((haico_stack.log_paths["backend"].parent.parent / "services.json")
                          .read_text())
    pids = [s["pid"] for s in services["services"]]
    ports = list(haico_stack.ports.values())
    seen = Path(os.environ["HAICO_TEST_SEEN"])
    seen.with_suffix(".part").write_text(json.dumps({"pids": pids, "ports": ports}))
    seen.with_suffix(".part").rename(seen)  # whole: the outer test reads it once it exists
    time.sleep(120)
"""


def test_ctrl_c_stops_every_service(
    campaign: CampaignProject, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    campaign.arm("demo")
    campaign.scripts("a.yaml", "id: a\nturns:\n  - user: hi\n")
    (campaign.experiments / "test_conversations.py").unlink()
    campaign.write("test_block.py", BLOCKING)
    seen = tmp_path / "seen.json"
    monkeypatch.setenv("HAICO_TEST_SEEN", str(seen))
    process = campaign.start("experiments/test_block.py")
    process.wait_for(seen.exists, timeout=120, what="the stack to come up")
    state = json.loads(seen.read_text())
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=60) == 2
    for pid in state["pids"]:
        wait_for(partial(_exited, pid), timeout=15, what=f"pid {pid} to exit")
    assert all(port_is_free(port) for port in state["ports"])


# A backend build that cannot start: it says why on stderr and exits 3.
BROKEN_BACKEND = shlex.join(
    [
        sys.executable,
        "-c",
        "import sys; print('backend: cannot read its configuration', file=sys.stderr); sys.exit(3)",
    ]
)


def test_a_failed_start_exits_78_with_the_log_tail_and_writes_no_record(
    campaign: CampaignProject,
) -> None:
    campaign.arm("demo")
    campaign.scripts(
        "a.jsonl",
        "".join(f'{{"id": "s{i}", "turns": [{{"user": "hello {i}"}}]}}\n' for i in range(3)),
    )
    campaign.write("test_conversations.py", CONVERSATION_MODULE)
    result = campaign.run_subprocess(
        "--haico-exit", "campaign", "--haico-backend-cmd", BROKEN_BACKEND
    )
    assert result.ret == 78, result.stdout.str() + result.stderr.str()
    assert "the stack of arm demo did not start" in result.stdout.str()
    assert "backend: cannot read its configuration" in result.stdout.str()
    # The job log says so at once; the item's error is one line, not the fixture's source.
    result.stdout.fnmatch_lines(
        [
            "haico: demo stack failed after *.* s: backend exited with status 3 before it was "
            "healthy (pid *, port *, attempt 1) (the haico summary has the rest)",
            "*_ ERROR at setup of test_conversation[[]demo-s0-r0[]] _*",
            "StackError: the stack of arm demo did not start: backend exited with status 3 "
            "before it was healthy (pid *, port *, attempt 1)",
            "*= haico =*",
        ]
    )
    assert "def haico_conversation" not in result.stdout.str()
    assert "haico: demo stack stopped" not in result.stdout.str()
    assert campaign.records("demo") == []
    services = json.loads(
        (next((campaign.arm_dir("demo") / "runs").iterdir()) / "services.json").read_text()
    )
    assert all(not is_alive(s["pid"]) for s in services["services"] if s["pid"])


AFTER_THE_ITEMS = """
import httpx


def test_after_the_campaign_items(haico_stack):
    response = httpx.get(
        haico_stack.backend_url + "/api/health",
        headers={"Authorization": f"Bearer {haico_stack.admin_token}"},
        trust_env=False,
    )
    assert response.status_code == 200
"""


def test_a_test_after_the_arms_last_item_gets_a_running_stack(campaign: CampaignProject) -> None:
    campaign.arm("demo")
    campaign.scripts("a.yaml", "id: a\nturns:\n  - user: hi\n")
    campaign.write("test_conversations.py", CONVERSATION_MODULE)
    campaign.write("test_zz_after.py", AFTER_THE_ITEMS)
    result = campaign.run_subprocess("-v")
    assert result.ret == 0, result.stdout.str()
    assert "test_after_the_campaign_items PASSED" in result.stdout.str()


def _exited(pid: int) -> bool:
    return not is_alive(pid)
