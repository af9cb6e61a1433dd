"""No secret of a run (the model key, the admin token, the database passwords) in any argv a
co-tenant can read in /proc while the stack runs, in the results directory, or in the run's
output, on the local profile. (The cluster profile's argv: tests/cluster.)"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from urllib.parse import urlsplit

from tests.harness import CampaignProject
from tests.procs import environ, tree
from tests.signals.conftest import run_dir, stack_campaign

# A hand-written test before the items (the arm's stack starts for it and its conversations
# run meanwhile): it holds the run until the outer test has read /proc, and hands it the
# read-only role's password (no service has it in its environment).
HOLD = """
import os
import time
from pathlib import Path


def test_aa_hold(haico_stack):
    password = haico_stack.readonly_dsn.split(":", 2)[2].split("@", 1)[0]
    ready = Path(os.environ["HAICO_TEST_READY"])
    ready.with_suffix(".part").write_text(password)
    ready.with_suffix(".part").rename(ready)  # whole: the outer test reads it once it exists
    go = Path(os.environ["HAICO_TEST_GO"])
    deadline = time.monotonic() + 120
    while not go.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
"""


def _argv(pids: set[int]) -> dict[int, bytes]:
    """pid -> argv (NUL-separated) of every live process in `pids` or under one of them."""
    argv = {}
    for pid in tree(pids):
        with contextlib.suppress(OSError):  # ended meanwhile
            argv[pid] = Path(f"/proc/{pid}/cmdline").read_bytes()
    return argv


def test_no_secret_in_argv_results_or_output_of_a_local_campaign(
    campaign: CampaignProject, tmp_path: Path
) -> None:
    stack_campaign(campaign, "[run]\nconcurrency = 2\n", items=3)
    campaign.write("test_aa_hold.py", HOLD)
    ready, go = tmp_path / "ready", tmp_path / "go"
    run = campaign.start(
        "--haico-exit", "campaign", env={"HAICO_TEST_READY": str(ready), "HAICO_TEST_GO": str(go)}
    )
    run.wait_for(ready.exists, timeout=180, what="the stack to run the hand-written test")
    services = {
        s["name"]: s["pid"]
        for s in json.loads((run_dir(campaign) / "services.json").read_text())["services"]
    }
    assert set(services) == {"llm", "postgres", "backend"}
    backend = environ(services["backend"])
    database_url = urlsplit(backend["HAICO_DATABASE_URL"])
    secrets = {
        "the model key": backend["VLLM_API_KEY"],
        "the admin token": backend["ADMIN_DEFAULT_API_TOKEN"],
        "the backend's database password": database_url.password or "",
        "the read-only role's password": ready.read_text(),
    }
    assert environ(services["llm"])["VLLM_API_KEY"] == secrets["the model key"]
    assert all(len(secret) >= 16 for secret in secrets.values()), secrets.keys()

    argv = _argv(set(services.values()) | {run.pid})
    assert len(argv) > len(services)  # Postgres' own processes too
    for pid, line in argv.items():
        for what, secret in secrets.items():
            assert secret.encode() not in line, f"{what} is in the argv of process {pid}"

    go.touch()
    assert run.wait(timeout=120) == 0, run.output()
    assert [r["verdict"] for r in campaign.records("demo")] == ["completed"] * 3
    for what, secret in secrets.items():
        assert secret not in run.output(), f"{what} is in the run's output"
    files = [path for path in campaign.root.joinpath("results").rglob("*") if path.is_file()]
    assert any(path.name == "run-config.json" for path in files)
    for path in files:
        content = path.read_bytes()
        for what, secret in secrets.items():
            assert secret.encode() not in content, f"{what} is in {path}"
