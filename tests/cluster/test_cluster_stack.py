"""The cluster profile end to end, with the vLLM and Apptainer shims: a conversation through
the backend, secrets only where they belong, the model server's wait, nothing left behind."""

from __future__ import annotations

import asyncio
import logging
import os
import pwd
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from pytest_haico.config.experiment import Script
from pytest_haico.driver.conversation import ConversationSetup, make_thread_id, run_conversation
from pytest_haico.driver.result import ConversationResult
from pytest_haico.driver.snapshots import PostgresSnapshotReader
from pytest_haico.errors import StackError
from pytest_haico.ledger.verdicts import Verdict
from pytest_haico.procfs import is_alive
from pytest_haico.provenance.dumps import DatabaseDumps
from pytest_haico.redact import Redactor
from pytest_haico.stack import Orchestrator
from pytest_haico.stack.apptainer import ContainerHttpService
from pytest_haico.stack.cluster import build_cluster_stack, build_vllm_service
from pytest_haico.stack.profiles import Stack
from pytest_haico.stack.service import new_secret
from tests.cluster.shim_site import (
    ARM,
    BACKEND_IMAGE_ENV,
    HOST_SECRET,
    ShimSite,
    scratch_site,
)
from tests.procs import environ, tree

SCRIPT = Script.model_validate(
    {"id": "two-turns", "turns": [{"user": "Hello, who are you?"}, {"user": "Write a document."}]}
)


def _build(site: ShimSite, root: Path) -> Stack:
    return build_cluster_stack(site.stack_request(root, state_dir=root))


def _processes(stack: Stack) -> dict[str, list[int]]:
    """Service name → its process and all its descendants (Postgres' children make their
    own sessions, so a session is not enough)."""
    return {
        name: sorted(tree([process.pid or 0]))
        for name, process in stack.orchestrator.processes.items()
    }


def _converse(stack: Stack, transcript: Path) -> ConversationResult:
    """SCRIPT once through the backend, as an arm session runs it."""

    async def converse() -> ConversationResult:
        reader = await PostgresSnapshotReader.connect(stack.readonly_dsn)
        try:
            async with httpx.AsyncClient(trust_env=False, timeout=None) as client:
                setup = ConversationSetup(
                    backend_url=stack.backend_url,
                    token=stack.admin_token,
                    endpoint_url=stack.model_endpoint,
                    arm=ARM,
                    snapshots=reader,
                    redactor=Redactor(stack.secrets),
                )
                return await run_conversation(
                    client,
                    setup,
                    script=SCRIPT,
                    thread_id=make_thread_id(transcript.stem, "cluster", 1),
                    transcript_path=transcript,
                )
        finally:
            await reader.aclose()

    return asyncio.run(converse())


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A running cluster stack on the shims; tests must leave it working."""
    with scratch_site() as site, _build(site, tmp_path_factory.mktemp("cluster")) as stack:
        yield stack


def test_a_conversation_runs_through_the_cluster_stack_and_stop_leaves_no_process(
    shim_site: ShimSite, tmp_path: Path
) -> None:
    stack = _build(shim_site, tmp_path).start()
    try:
        processes = _processes(stack)
        assert isinstance(stack.backend, ContainerHttpService)
        private = [stack.backend.private_dir, stack.postgres.run_dir]
        result = _converse(stack, tmp_path / "transcript.jsonl")
        assert result.verdict is Verdict.COMPLETED, result.error
        assert [turn.model_id for turn in result.turns] == ["qwen32b", "qwen32b"]
        assert sum(turn.tool_calls for turn in result.turns) >= 1  # the parser flags reached it
    finally:
        stack.stop()
    assert set(processes) == {"llm", "postgres", "backend"}
    for name, pids in processes.items():
        assert pids, name
        assert not [pid for pid in pids if is_alive(pid)], name
    # The env files (and the data directory) went with their private directories.
    assert not [path for path in private if path is None or path.exists()]


def test_no_secret_is_in_the_cmdline_of_any_process_of_any_service(running: Stack) -> None:
    secrets = {
        "postgres password": running.postgres.secrets[0],
        "read-only password": running.postgres.secrets[1],
        "model key": running.api_key,
        "admin token": running.admin_token,
    }
    scanned = 0
    for name, pids in _processes(running).items():
        assert pids, name
        for pid in pids:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            scanned += 1
            found = [what for what, secret in secrets.items() if secret.encode() in cmdline]
            assert not found, f"{name} pid {pid}: {found}"
    assert scanned >= 5  # Postgres alone runs several processes


def test_the_backend_sees_exactly_its_image_env_and_its_env_file(running: Stack) -> None:
    backend = running.backend
    assert isinstance(backend, ContainerHttpService) and backend.port is not None
    pid = running.orchestrator.processes["backend"].pid or 0
    seen = environ(pid)
    assert seen == {**BACKEND_IMAGE_ENV, **backend.container_env(backend.port)}
    assert "OPENAI_ENDPOINT_URL" not in seen
    assert HOST_SECRET not in seen.values()  # neither OPENAI_API_KEY nor APPTAINERENV_ passed
    assert seen["HAICO_MODEL_ENDPOINT"] == running.model_endpoint


def test_env_files_are_0600_in_private_directories_under_the_node_local_tmpdir(
    running: Stack,
) -> None:
    backend = running.backend
    assert isinstance(backend, ContainerHttpService)
    tmpdir = Path(tempfile.gettempdir())
    for env_file in (backend.env_file, running.postgres.env_file):
        assert env_file is not None
        info = env_file.stat()
        assert stat.S_IMODE(info.st_mode) == 0o600, env_file
        assert env_file.parent.parent == tmpdir
        directory = env_file.parent.stat()
        assert directory.st_uid == os.geteuid() and not directory.st_mode & 0o066, env_file
    assert running.admin_token in backend.env_file.read_text()


def test_the_model_server_has_its_key_in_its_environment_and_postgres_is_not_root(
    running: Stack,
) -> None:
    processes = running.orchestrator.processes
    assert environ(processes["llm"].pid or 0)["VLLM_API_KEY"] == running.api_key
    unauthorized = httpx.get(f"{running.llm_url}/v1/models", trust_env=False)
    assert unauthorized.status_code == 401
    if os.geteuid() == 0:
        assert processes["postgres"].uid == pwd.getpwnam(running.postgres.user or "").pw_uid


def test_the_final_pg_dump_runs_in_the_postgres_image_over_the_private_socket(
    running: Stack, tmp_path: Path
) -> None:
    dumps = DatabaseDumps(running.postgres, tmp_path / "dumps", interval_s=0)
    dump = dumps.dump("final")
    assert dump.read_bytes().startswith(b"PGDMP")  # pg_dump's custom format
    assert dump.parent == tmp_path / "dumps"


def test_a_model_server_dying_while_it_loads_fails_the_start_at_once(
    shim_site: ShimSite, tmp_path: Path
) -> None:
    shim_site.configure_vllm(load_s=0.2, load_lines=2, die_during_load=True)
    stack = _build(shim_site, tmp_path)
    assert stack.llm is not None and stack.llm.stall_timeout_s == 120.0
    with pytest.raises(StackError) as raised:
        stack.start()
    message = str(raised.value)  # the death, not the 2-minute stall timeout
    assert message.startswith("llm exited with status 1 before it was healthy (pid ")
    assert "RuntimeError: CUDA error: out of memory" in message
    assert not [p for p in stack.orchestrator.processes.values() if is_alive(p.pid or 0)]


def test_the_wait_for_the_model_server_logs_its_last_log_line_every_interval(
    shim_site: ShimSite, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    shim_site.configure_vllm(load_s=2.4, load_lines=4)
    llm = build_vllm_service(
        ARM, venv=shim_site.venv, api_key=new_secret(), environ=shim_site.environ, hf_home=None
    )
    llm.progress_every_s = 0.5
    caplog.set_level(logging.INFO, logger="pytest_haico.stack.start_wait")
    with Orchestrator([llm], tmp_path / "logs", state_dir=tmp_path):
        pass
    said = [r.getMessage() for r in caplog.records if "not healthy yet" in r.getMessage()]
    assert len(said) >= 3, said
    assert all(
        line.startswith("llm: not healthy yet after ")
        and " s of the stall timeout's 120 s); its log last said: " in line
        for line in said
    )
    last_words = [line.split("; its log last said: ", 1)[1] for line in said]
    assert "Loading safetensors checkpoint shards:  25% Completed | 1/4" in last_words
    assert all(not word.startswith("--- pytest-haico") for word in last_words)
