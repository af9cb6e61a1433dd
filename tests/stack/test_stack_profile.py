"""The local profile: the stand-ins' command lines, secrets, and a real start."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import httpx
import psycopg

from pytest_haico.config.experiment import Arm
from pytest_haico.procfs import is_alive
from pytest_haico.stack import Stack, StackRequest, build_local_stack


def _build(
    run_dir: Path, *, tools: bool = True, state_dir: Path | None = None, **standin: Any
) -> Stack:
    arm = Arm.model_validate(
        {
            "name": "stand-in",
            "vllm": {
                "max_model_len": 4096,
                "enable_tool_calling": tools,
                "tool_call_parser": "hermes" if tools else None,
            },
            "standin": {"seed": 7, **standin},
        }
    )
    return build_local_stack(StackRequest(arm=arm, run_dir=run_dir, state_dir=state_dir))


def test_llm_and_backend_command_lines(tmp_path: Path) -> None:
    stack = _build(tmp_path, substitute_model="other/model", rate_limit_rpm=30)
    assert stack.llm is not None  # the stand-in model server: no --haico-model-endpoint
    assert list(stack.llm.argv(20001)) == [
        sys.executable, "-m", "pytest_haico.standins.llm",
        "--model", "stand-in", "--served-model-name", "stand-in",
        "--host", "127.0.0.1", "--port", "20001", "--max-model-len", "4096",
        "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
        "--persona", "helpful", "--latency-ms", "0", "--seed", "7",
    ]  # fmt: skip
    assert list(stack.backend.argv(20003)) == [
        sys.executable, "-m", "pytest_haico.standins.backend",
        "--host", "127.0.0.1", "--port", "20003",
        "--substitute-model", "other/model", "--rate-limit-rpm", "30",
    ]  # fmt: skip
    assert stack.llm.command(20001).env["VLLM_API_KEY"] == stack.api_key
    assert stack.model_endpoint == "http://vllm.localhost:20001/v1"
    # The stand-in waits for its database itself, so it starts alongside Postgres.
    assert (stack.backend.requires, stack.backend.waits_for) == ((), ("postgres",))
    assert stack.backend.health_headers == {"Authorization": f"Bearer {stack.admin_token}"}


def test_the_standins_max_num_seqs_reaches_its_command_line(tmp_path: Path) -> None:
    stack = _build(tmp_path, max_num_seqs=2)
    assert stack.llm is not None
    assert list(stack.llm.argv(20001))[-2:] == ["--max-num-seqs", "2"]


def test_local_stack_starts_answers_and_stops(tmp_path: Path) -> None:
    stack = _build(tmp_path, tools=False, state_dir=tmp_path)
    with stack:
        procs = stack.orchestrator.processes
        pids = {name: p.pid or 0 for name, p in procs.items()}
        # It counts as healthy only after Postgres. (That it starts alongside is the
        # declaration above and the orchestrator's tests: a port retry respawns it later.)
        assert (procs["backend"].healthy_at or 0) >= (procs["postgres"].healthy_at or 0)
        models = httpx.get(
            f"{stack.llm_url}/v1/models", headers={"Authorization": f"Bearer {stack.api_key}"}
        )
        assert [m["id"] for m in models.json()["data"]] == ["stand-in"]
        health = httpx.get(
            f"{stack.backend_url}/api/health",
            headers={"Authorization": f"Bearer {stack.admin_token}"},
        )
        assert health.json() == {"status": "ok"}
        environ = Path(f"/proc/{pids['backend']}/environ").read_bytes().split(b"\0")
        # The same DSN, refusing any authentication but scram (it may connect early).
        database_url = f"HAICO_DATABASE_URL={stack.dsn}?require_auth=scram-sha-256"
        assert database_url.encode() in environ
        with psycopg.connect(stack.readonly_dsn) as conn:
            assert conn.execute("SELECT current_user").fetchone() == ("haico_readonly",)
        for name, pid in pids.items():
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            assert not [s for s in stack.secrets if s.encode() in cmdline], name
        assert set(stack.timings) == {"llm", "postgres", "backend"}
    assert not any(is_alive(pid) for pid in pids.values())
    for name, log in stack.log_paths.items():
        text = log.read_text()
        assert not [s for s in stack.secrets if s in text], name
