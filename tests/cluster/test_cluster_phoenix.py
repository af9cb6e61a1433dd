"""Phoenix on the cluster profile (PHOENIX_ENABLED=1 in cluster.env), with the Phoenix shim:
its argv and environment pinned, the backend pointed at it, its database kept in the run
directory at stop, and the errors when its image is missing."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shlex
import sqlite3
import stat
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import httpx
import pytest

from pytest_haico.config.cluster_env import ClusterEnv
from pytest_haico.config.settings import Settings
from pytest_haico.errors import ConfigError, StackError
from pytest_haico.gates.filesystem import check_inputs_present
from pytest_haico.procfs import is_alive
from pytest_haico.runner.preflight import cluster_images
from pytest_haico.stack.apptainer import ContainerHttpService
from pytest_haico.stack.cluster import build_cluster_stack
from pytest_haico.stack.phoenix import PhoenixService, save_sqlite
from pytest_haico.stack.profiles import Stack
from pytest_haico.stack.request import BackendCommand
from tests.cluster.shim_site import (
    ARM,
    PHOENIX_DIGEST,
    PHOENIX_IMAGE,
    PHOENIX_IMAGE_ENV,
    ShimSite,
)
from tests.procs import environ, group_members

PORTS = {"llm": 25000, "postgres": 25001, "phoenix": 25003, "backend": 25002}
RESULTS_MODE = 0o604  # not what a umask makes of anything: the stack set it


def _site(shim_site: ShimSite, **change: str | None) -> ClusterEnv:
    values = {**shim_site.cluster_env.values, "PHOENIX_ENABLED": "1", **change}
    return dataclasses.replace(
        shim_site.cluster_env, values={k: v for k, v in values.items() if v is not None}
    )


def _build(shim_site: ShimSite, run: Path, **options: Any) -> Stack:
    return build_cluster_stack(shim_site.stack_request(run, site=_site(shim_site), **options))


def _phoenix(stack: Stack) -> PhoenixService:
    found = [s for s in stack.orchestrator.services if isinstance(s, PhoenixService)]
    assert len(found) == 1
    return found[0]


def _read_env_file(path: Path) -> dict[str, str]:
    words = [shlex.split(line)[0] for line in path.read_text().splitlines() if line.strip()]
    return dict(word.split("=", 1) for word in words)


def test_phoenix_runs_from_its_image_on_loopback_with_a_private_working_directory(
    shim_site: ShimSite, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stack = _build(shim_site, tmp_path)
    monkeypatch.setattr(stack.orchestrator, "port", PORTS.__getitem__)
    assert [s.name for s in stack.orchestrator.services] == [
        "llm", "postgres", "phoenix", "backend",
    ]  # fmt: skip
    phoenix, backend = _phoenix(stack), stack.backend
    assert isinstance(backend, ContainerHttpService)
    assert backend.requires == ("postgres", "phoenix")
    assert (phoenix.health_path, phoenix.start_timeout) == ("/healthz", 300.0)
    phoenix.reserve()
    backend.reserve()
    private = phoenix.private_dir
    assert private is not None and backend.private_dir is not None
    try:
        command = phoenix.command(25003)
        sif = shim_site.sif_dir / f"phoenix-sha256-{PHOENIX_DIGEST}.sif"
        assert list(command.argv) == [
            str(shim_site.bin_dir / "apptainer"), "exec", "--cleanenv", "--no-home",
            "--env-file", f"{private}/service.env", "--bind", f"{private}/working",
            str(sif), "python3", "-m", "phoenix.server.main", "serve",
        ]  # fmt: skip
        assert dict(command.env) == {
            "PATH": shim_site.environ["PATH"],
            "LANG": "C.UTF-8",
            "TMPDIR": tempfile.gettempdir(),
        }
        grpc = phoenix.grpc_port
        assert grpc is not None and grpc not in PORTS.values()
        assert _read_env_file(private / "service.env") == {
            "PHOENIX_HOST": "127.0.0.1",
            "PHOENIX_PORT": "25003",
            "PHOENIX_GRPC_PORT": str(grpc),
            "PHOENIX_WORKING_DIR": f"{private}/working",
            "PHOENIX_TELEMETRY_ENABLED": "false",
        }
        for directory in (private, private / "working"):
            info = directory.stat()
            assert stat.S_IMODE(info.st_mode) == 0o700, directory
            assert info.st_uid == os.geteuid()
        assert private.parent == Path(tempfile.gettempdir())  # node-local
        assert phoenix.cleanup_paths == (private,)  # the janitor's, should we die
        backend_env = backend.container_env(25002)
        assert backend_env["PHOENIX_ENABLED"] == "1"
        assert backend_env["PHOENIX_COLLECTOR_ENDPOINT"] == "http://127.0.0.1:25003/v1/traces"
    finally:
        phoenix.ports.release_all()
        phoenix.cleanup()
        backend.cleanup()
    assert not private.exists()
    assert not (tmp_path / "phoenix.db").exists()  # it never ran: nothing to keep


def test_without_phoenix_enabled_no_phoenix_runs_and_its_sif_is_not_needed(
    shim_site: ShimSite, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (shim_site.sif_dir / f"phoenix-sha256-{PHOENIX_DIGEST}.sif").unlink()
    site = _site(shim_site, PHOENIX_ENABLED=None)
    stack = build_cluster_stack(shim_site.stack_request(tmp_path, site=site))
    monkeypatch.setattr(stack.orchestrator, "port", PORTS.__getitem__)
    assert [s.name for s in stack.orchestrator.services] == ["llm", "postgres", "backend"]
    assert stack.backend.requires == ("postgres",)
    assert "PHOENIX_COLLECTOR_ENDPOINT" not in stack.backend.env()


def test_a_backend_command_runs_without_phoenix(shim_site: ShimSite, tmp_path: Path) -> None:
    stack = _build(shim_site, tmp_path, backend_command=BackendCommand("./serve", tmp_path))
    assert [s.name for s in stack.orchestrator.services] == ["llm", "postgres", "backend"]


def test_phoenix_enabled_without_phoenix_image_is_a_config_error_and_a_failed_gate(
    shim_site: ShimSite, tmp_path: Path
) -> None:
    site = _site(shim_site, PHOENIX_IMAGE=None)
    with pytest.raises(ConfigError) as raised:
        build_cluster_stack(shim_site.stack_request(tmp_path, site=site))
    assert str(raised.value) == (
        f"{shim_site.root}/cluster.env: PHOENIX_IMAGE: required by PHOENIX_ENABLED=1: Phoenix's "
        "image pinned by digest (docker://<repo>@sha256:<64 hex>) or the absolute path of a .sif"
    )
    settings = cast(Settings, SimpleNamespace(site=site, backend_image=None, backend_cmd=None))
    gate = cluster_images(settings, ARM, shim_site.environ)
    assert not isinstance(gate, list)
    assert (gate.name, gate.passed) == ("inputs_present", False)
    assert gate.detail == f"cannot locate the images to run: {raised.value}"


def test_a_missing_phoenix_sif_is_a_stack_error_and_fails_gate_inputs_present(
    shim_site: ShimSite, tmp_path: Path
) -> None:
    sif = shim_site.sif_dir / f"phoenix-sha256-{PHOENIX_DIGEST}.sif"
    settings = cast(
        Settings, SimpleNamespace(site=_site(shim_site), backend_image=None, backend_cmd=None)
    )
    images = cluster_images(settings, ARM, shim_site.environ)
    assert isinstance(images, list) and images[-1] == sif
    sif.unlink()
    with pytest.raises(StackError) as raised:
        _build(shim_site, tmp_path)
    assert str(raised.value).startswith(
        f"phoenix: the image {PHOENIX_IMAGE} has no SIF at {sif}; pull it once, before "
        "the job, with `haico env`"
    )
    gate = check_inputs_present(
        ARM, needs_weights=False, hf_cache=tmp_path, scripts=[], images=images
    )
    assert not gate.passed
    assert gate.detail.startswith(f"the image {sif} does not exist")


def test_the_stack_starts_phoenix_and_keeps_its_database_in_the_run_directory(
    shim_site: ShimSite, tmp_path: Path
) -> None:
    run = tmp_path / "runs" / "r1"
    stack = _build(shim_site, run, state_dir=tmp_path, log_mode=RESULTS_MODE).start()
    try:
        phoenix = _phoenix(stack)
        processes = stack.orchestrator.processes
        private = phoenix.private_dir
        assert private is not None and phoenix.port is not None
        seen = environ(processes["phoenix"].pid or 0)
        assert seen == {**PHOENIX_IMAGE_ENV, **phoenix.container_env(phoenix.port)}
        endpoint = f"http://127.0.0.1:{phoenix.port}/v1/traces"
        assert phoenix.collector_endpoint == endpoint
        backend_seen = environ(processes["backend"].pid or 0)
        assert backend_seen["PHOENIX_COLLECTOR_ENDPOINT"] == endpoint
        assert backend_seen["PHOENIX_ENABLED"] == "1"
        health = httpx.get(
            f"{stack.backend_url}/api/health",
            headers={"Authorization": f"Bearer {stack.admin_token}"},
            trust_env=False,
        )
        assert health.status_code == 200
        # The stand-in backend sends no traces: one OTLP request as an exporter sends it.
        span = b"\x0a\x02trace-of-a-test"
        sent = httpx.post(
            endpoint,
            content=span,
            headers={"Content-Type": "application/x-protobuf"},
            trust_env=False,
        )
        assert sent.status_code == 200
        grpc = phoenix.grpc_port
        pgids = {p.pid or 0 for p in processes.values()}
    finally:
        stack.stop()
    kept = run / "phoenix.db"
    assert stat.S_IMODE(kept.stat().st_mode) == RESULTS_MODE
    with contextlib.closing(sqlite3.connect(kept)) as database:
        rows = database.execute("SELECT content_type, body FROM traces").fetchall()
    assert rows == [("application/x-protobuf", span)]
    assert not private.exists()
    # What a run's stack leaves in its run directory: the logs, the registry's mirror.
    assert sorted(p.name for p in run.iterdir()) == ["logs", "phoenix.db", "services.json"]
    assert not [pid for pid in pgids if is_alive(pid)]
    assert not group_members(pgids)
    assert grpc not in phoenix.ports.claimed


def test_save_sqlite_reads_the_write_ahead_log_and_writes_a_plain_copy_with_the_mode(
    tmp_path: Path,
) -> None:
    source = tmp_path / "phoenix.db"
    writer = sqlite3.connect(source)
    writer.execute("PRAGMA journal_mode=WAL")
    writer.execute("PRAGMA wal_autocheckpoint=0")
    writer.execute("CREATE TABLE spans (name TEXT)")
    writer.execute("INSERT INTO spans VALUES ('in the log only')")
    writer.commit()
    assert (tmp_path / "phoenix.db-wal").stat().st_size > 0
    destination = tmp_path / "run" / "phoenix.db"
    destination.parent.mkdir()
    try:
        assert save_sqlite(source, destination, mode=0o640)
    finally:
        writer.close()
    assert stat.S_IMODE(destination.stat().st_mode) == 0o640
    assert [p.name for p in destination.parent.iterdir()] == ["phoenix.db"]
    assert not (tmp_path / "phoenix.db.snapshot").exists()
    with contextlib.closing(sqlite3.connect(destination)) as copy:
        assert copy.execute("SELECT name FROM spans").fetchall() == [("in the log only",)]
        # Not WAL: a reader without write access to the run directory can open it.
        assert copy.execute("PRAGMA journal_mode").fetchone() == ("delete",)
    assert not save_sqlite(tmp_path / "none.db", tmp_path / "run" / "none.db", mode=0o640)
