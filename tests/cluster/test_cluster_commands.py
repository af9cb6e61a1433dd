"""The cluster profile's services, pinned: argv and environment for an arm and a cluster.env,
the env files, the SIF paths, and the errors before anything starts."""

from __future__ import annotations

import dataclasses
import os
import shlex
import stat
import tempfile
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from pytest_haico.config.cluster_site import sif_path
from pytest_haico.config.experiment import Arm, Script
from pytest_haico.config.identity import item_id
from pytest_haico.errors import ConfigError, StackError
from pytest_haico.stack.apptainer import ContainerHttpService, host_environment
from pytest_haico.stack.cluster import build_cluster_stack
from pytest_haico.stack.pgcluster import SUPERUSER
from pytest_haico.stack.profiles import Stack
from pytest_haico.stack.request import BackendCommand, ModelEndpoint
from pytest_haico.stack.service import write_env_file
from tests.cluster.shim_site import (
    ARM,
    BACKEND_DIGEST,
    BACKEND_IMAGE,
    POSTGRES_DIGEST,
    ShimSite,
)

PORTS = {"llm": 25000, "postgres": 25001, "backend": 25002}


def _build(site: ShimSite, tmp_path: Path, *, arm: Arm = ARM, **options: Any) -> Stack:
    return build_cluster_stack(site.stack_request(tmp_path, arm=arm, **options))


def _read_env_file(path: Path) -> dict[str, str]:
    """As Apptainer (and the shim) read it: shell words, one KEY=VALUE per line."""
    words = [shlex.split(line)[0] for line in path.read_text().splitlines() if line.strip()]
    return dict(word.split("=", 1) for word in words)


def _host_env(site: ShimSite) -> dict[str, str]:
    """What the `apptainer` process gets of the site's host environment."""
    return {"PATH": site.environ["PATH"], "LANG": "C.UTF-8", "TMPDIR": tempfile.gettempdir()}


def _fake_ports(monkeypatch: pytest.MonkeyPatch, stack: Stack) -> None:
    monkeypatch.setattr(stack.orchestrator, "port", PORTS.__getitem__)


def test_vllm_runs_from_the_venv_with_the_arms_flags_and_its_key_in_the_environment(
    shim_site: ShimSite, tmp_path: Path
) -> None:
    stack = _build(shim_site, tmp_path)
    assert stack.llm is not None
    command = stack.llm.command(25000)
    scratch = stack.llm.scratch_dir  # vLLM's $TMPDIR, for its sockets: private, removed after
    stack.llm.cleanup()
    assert scratch is not None and scratch.parent == Path(tempfile.gettempdir())
    assert not scratch.exists()
    venv = shim_site.venv
    assert list(command.argv) == [
        f"{venv}/bin/vllm", "serve", "/models/Qwen2.5-32B-Instruct",
        "--served-model-name", "qwen32b", "--host", "127.0.0.1", "--port", "25000",
        "--max-model-len", "32768", "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
        "--tensor-parallel-size", "2", "--gpu-memory-utilization", "0.92",
    ]  # fmt: skip
    environ = shim_site.environ
    assert dict(command.env) == {
        "PATH": f"{venv}/bin:{environ['PATH']}",
        "VIRTUAL_ENV": str(venv),
        "HOME": environ["HOME"],
        "LANG": "C.UTF-8",
        "TMPDIR": str(scratch),
        "CUDA_VISIBLE_DEVICES": "0,1",
        "OPENAI_API_KEY": environ["OPENAI_API_KEY"],  # the user's own process, like pytest
        "APPTAINERENV_OPENAI_API_KEY": environ["APPTAINERENV_OPENAI_API_KEY"],
        "HF_HOME": f"{shim_site.root}/work/hf",
        "HF_HUB_OFFLINE": "1",
        "VLLM_API_KEY": stack.api_key,
    }
    assert stack.api_key not in " ".join(command.argv)
    assert (stack.llm.start_timeout, stack.llm.stall_timeout_s) == (None, 120.0)
    assert stack.llm.stall_setting == "[vllm] start_stall_timeout_s of arms/qwen32b.toml"
    assert stack.llm.progress_every_s == 30.0
    assert stack.model_endpoint == "http://vllm.localhost:25000/v1"


def test_an_hf_model_is_served_by_id_and_revision_with_parallel_widths(
    shim_site: ShimSite, tmp_path: Path
) -> None:
    arm = Arm.model_validate(
        {
            "name": "hf",
            "model": {"hf_id": "Qwen/Qwen2.5-7B-Instruct", "revision": "a" * 40},
            "vllm": {"enable_tool_calling": False, "tool_call_parser": None,
                     "data_parallel_size": 2, "start_timeout_s": 3600},
        }
    )  # fmt: skip
    stack = _build(shim_site, tmp_path, arm=arm)
    assert stack.llm is not None
    assert list(stack.llm.argv(25000))[2:] == [
        "Qwen/Qwen2.5-7B-Instruct", "--served-model-name", "hf",
        "--host", "127.0.0.1", "--port", "25000", "--max-model-len", "8192",
        "--data-parallel-size", "2", "--revision", "a" * 40,
    ]  # fmt: skip
    assert stack.llm.start_timeout == 3600.0


def test_postgres_runs_postgres_d_in_its_image_with_an_env_file_and_no_secret(
    shim_site: ShimSite, tmp_path: Path
) -> None:
    postgres = _build(shim_site, tmp_path).postgres
    postgres.reserve()
    try:
        run = postgres.run_dir
        command = postgres.command(25001)
        sif = shim_site.sif_dir / f"postgres-sha256-{POSTGRES_DIGEST}.sif"
        apptainer = str(shim_site.bin_dir / "apptainer")
        head = [apptainer, "exec", "--cleanenv", "--no-home", "--env-file", f"{run}/postgres.env"]
        assert list(command.argv) == [
            *head, "--bind", str(run), str(sif),
            "postgres", "-D", f"{run}/data", "-p", "25001", "-c", "listen_addresses=127.0.0.1",
            "-c", f"unix_socket_directories={run}/socket", "-c", "unix_socket_permissions=0700",
        ]  # fmt: skip
        assert dict(command.env) == _host_env(shim_site)
        assert command.user == ("postgres" if os.geteuid() == 0 else None)
        assert postgres.version.startswith(str(postgres.binaries.major))
        env_file = run / "postgres.env"
        assert _read_env_file(env_file) == {"LC_ALL": "C", "PGCONNECT_TIMEOUT": "10"}
        info = env_file.stat()
        assert stat.S_IMODE(info.st_mode) == 0o600
        assert info.st_uid == (run / "data").stat().st_uid  # the server's user reads it
        dump = postgres.dump_command(tmp_path / "dumps" / "final.dump")
        # Over the private socket by peer authentication: no password anywhere.
        assert list(dump.argv) == [
            *head, "--bind", str(run), "--bind", str(tmp_path / "dumps"), str(sif),
            "pg_dump", "--format=custom", f"--file={tmp_path}/dumps/final.dump",
            f"--host={run}/socket", "--port=25001", f"--username={SUPERUSER}", "--dbname=haico",
        ]  # fmt: skip
        assert dict(dump.env) == _host_env(shim_site)
    finally:
        postgres.cleanup()
    assert not run.exists()


def test_the_backend_runs_in_its_image_with_the_contract_and_config_in_a_0600_env_file(
    shim_site: ShimSite, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stack = _build(shim_site, tmp_path)
    backend = stack.backend
    assert isinstance(backend, ContainerHttpService)
    _fake_ports(monkeypatch, stack)
    backend.reserve()
    private = backend.private_dir
    assert private is not None
    try:
        command = backend.command(25002)
        sif = shim_site.sif_dir / f"haico-backend-sha256-{BACKEND_DIGEST}.sif"
        assert list(command.argv) == [
            str(shim_site.bin_dir / "apptainer"), "exec", "--cleanenv", "--no-home",
            "--env-file", f"{private}/service.env", "--bind", f"{private}/hosts:/etc/hosts:ro",
            str(sif), "haico-backend", "--host", "127.0.0.1", "--port", "25002",
        ]  # fmt: skip
        assert dict(command.env) == _host_env(shim_site)
        password = stack.postgres.secrets[0]
        env_file = private / "service.env"
        assert _read_env_file(env_file) == {
            "ADMIN_DEFAULT_API_TOKEN": stack.admin_token,
            "VLLM_API_KEY": stack.api_key,
            "HAICO_DATABASE_URL": f"postgresql://postgres:{password}@127.0.0.1:25001/haico",
            "HAICO_MODEL_ENDPOINT": "http://vllm.localhost:25000/v1",
            "HAICO_BACKEND_HOST": "127.0.0.1",
            "HAICO_BACKEND_PORT": "25002",
            "PHOENIX_ENABLED": "0",
            "HAICO_STUDY_ENABLED": "0",
            "HAICO_RATE_LIMIT_ENABLED": "0",
            "HAICO_MAX_TOKENS": "4096",
        }
        assert stat.S_IMODE(env_file.stat().st_mode) == 0o600
        assert stat.S_IMODE(private.stat().st_mode) == 0o700
        assert private.parent == Path(tempfile.gettempdir())  # node-local, never the results
        hosts = (private / "hosts").read_text().splitlines()
        assert hosts[1] == "127.0.0.1\tvllm.localhost vllm"
        assert not [s for s in stack.secrets if s in " ".join(command.argv)]
        assert backend.requires == ("postgres",)
        assert backend.cleanup_paths == (private,)  # the janitor's, should we die
        # A respawn (Postgres moved) gets a fresh file with the new port.
        monkeypatch.setitem(PORTS, "postgres", 25011)
        backend.command(25002)
        assert ":25011/haico" in _read_env_file(env_file)["HAICO_DATABASE_URL"]
    finally:
        backend.cleanup()
    assert not private.exists()
    assert stack.backend_config == {
        "PHOENIX_ENABLED": "0",
        "HAICO_STUDY_ENABLED": "0",
        "HAICO_RATE_LIMIT_ENABLED": "0",
        "HAICO_MAX_TOKENS": "4096",
    }


def test_phoenix_enabled_in_cluster_env_turns_tracing_on(
    shim_site: ShimSite, tmp_path: Path
) -> None:
    values = {**shim_site.cluster_env.values, "PHOENIX_ENABLED": "1"}
    site = dataclasses.replace(shim_site.cluster_env, values=values)
    stack = build_cluster_stack(shim_site.stack_request(tmp_path, site=site))
    assert stack.backend_config["PHOENIX_ENABLED"] == "1"


def test_an_existing_model_endpoint_and_a_backend_command_replace_vllm_and_the_image(
    shim_site: ShimSite, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    endpoint = ModelEndpoint("http://vllm-gpu07:8000/v1", "shared-key")
    stack = _build(
        shim_site,
        tmp_path,
        model_endpoint=endpoint,
        backend_command=BackendCommand("./serve --port {port}", tmp_path),
    )
    _fake_ports(monkeypatch, stack)
    assert stack.llm is None
    assert [s.name for s in stack.orchestrator.services] == ["postgres", "backend"]
    assert not isinstance(stack.backend, ContainerHttpService)
    env = stack.backend.command(25002).env
    assert env["HAICO_MODEL_ENDPOINT"] == "http://vllm-gpu07:8000/v1"
    assert env["VLLM_API_KEY"] == "shared-key"
    assert stack.backend_config == {}


def test_os_open_makes_the_env_file_0600_exclusively_whatever_the_umask(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[int, int]] = []
    real_open = os.open

    def recording_open(path: Any, flags: int, mode: int = 0o777, **kw: Any) -> int:
        calls.append((flags, mode))
        return real_open(path, flags, mode, **kw)

    monkeypatch.setattr(os, "open", recording_open)
    value = 'it\'s $HOME & `x` "q" ?*'
    for umask in (0o000, 0o277):
        path = tmp_path / f"env-{umask:o}"
        old = os.umask(umask)
        try:
            write_env_file(path, {"A": value, "B": ""})
        finally:
            os.umask(old)
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert _read_env_file(path) == {"A": value, "B": ""}
    flags, mode = calls[0]
    assert flags & os.O_CREAT and flags & os.O_EXCL and flags & os.O_NOFOLLOW
    assert mode == 0o600
    (tmp_path / "taken").write_text("someone else's")
    with pytest.raises(FileExistsError):
        write_env_file(tmp_path / "taken", {"A": "b"})
    assert (tmp_path / "taken").read_text() == "someone else's"
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(FileExistsError):
        write_env_file(tmp_path / "link", {"A": "b"})
    assert not (tmp_path / "elsewhere").exists()
    with pytest.raises(StackError, match="not a plain variable"):
        write_env_file(tmp_path / "bad", {"A": "two\nlines"})
    assert not (tmp_path / "bad").exists()


def test_apptainer_gets_no_variable_that_reaches_the_container_or_holds_a_secret() -> None:
    environ = {
        "PATH": "/bin",
        "HOME": "/home/u",
        "LC_CTYPE": "C.UTF-8",
        "APPTAINER_BINDPATH": "/scratch",
        "APPTAINERENV_TOKEN": "t",
        "SINGULARITYENV_TOKEN": "t",
        "OPENAI_API_KEY": "k",
        "HF_TOKEN": "h",
    }
    assert host_environment(environ) == {
        "PATH": "/bin",
        "LC_CTYPE": "C.UTF-8",
        "APPTAINER_BINDPATH": "/scratch",
    }


def test_sifs_live_in_sif_dir_named_by_repository_and_digest(tmp_path: Path) -> None:
    digest = "0123456789abcdef" * 4
    ref = f"docker://ghcr.io/Example/HAICO-Backend@sha256:{digest}"
    assert sif_path(ref, tmp_path) == tmp_path / f"haico-backend-sha256-{digest}.sif"
    assert sif_path("/images/pg.sif", tmp_path) == Path("/images/pg.sif")
    for bad in ("docker://postgres:16", "images/pg.sif", f"docker://pg@sha256:{digest[:10]}"):
        with pytest.raises(ConfigError, match="neither pinned by digest"):
            sif_path(bad, tmp_path)


def test_sif_dir_defaults_to_cluster_work_and_may_be_set(
    shim_site: ShimSite, tmp_path: Path
) -> None:
    moved = tmp_path / "sifs"
    shim_site.sif_dir.rename(moved)
    values = {**shim_site.cluster_env.values, "SIF_DIR": str(moved)}
    site = dataclasses.replace(shim_site.cluster_env, values=values)
    stack = build_cluster_stack(shim_site.stack_request(tmp_path, site=site))
    assert isinstance(stack.backend, ContainerHttpService)
    assert stack.backend.apptainer.image.parent == moved


def test_a_missing_sif_names_where_it_should_be_and_how_to_pull_it(
    shim_site: ShimSite, tmp_path: Path
) -> None:
    sif = shim_site.sif_dir / f"haico-backend-sha256-{BACKEND_DIGEST}.sif"
    sif.unlink()
    with pytest.raises(StackError) as raised:
        _build(shim_site, tmp_path)
    assert str(raised.value) == (
        f"backend: the image {BACKEND_IMAGE} has no SIF at {sif}; pull it once, "
        "before the job, with `haico env`; SIFs live in SIF_DIR "
        "(cluster.env; default $CLUSTER_WORK/sif)"
    )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"POSTGRES_IMAGE": None}, "POSTGRES_IMAGE: required by the cluster profile"),
        ({"BACKEND_IMAGE": "docker://ghcr.io/x/backend:latest"}, "neither pinned by digest"),
        ({"VLLM_VENV": None}, "VLLM_VENV: not set: the cluster profile starts vLLM from it"),
    ],
)
def test_cluster_env_without_what_the_profile_needs_is_a_config_error(
    shim_site: ShimSite, tmp_path: Path, change: dict[str, str | None], message: str
) -> None:
    values = {**shim_site.cluster_env.values, **change}
    site = dataclasses.replace(
        shim_site.cluster_env, values={k: v for k, v in values.items() if v is not None}
    )
    with pytest.raises(ConfigError, match=message) as raised:
        build_cluster_stack(shim_site.stack_request(tmp_path, site=site))
    assert str(raised.value).startswith(f"{shim_site.root}/cluster.env: ")


def test_no_apptainer_on_path_or_no_vllm_in_the_venv_is_a_stack_error(
    shim_site: ShimSite, tmp_path: Path
) -> None:
    environ = {**shim_site.environ, "PATH": "/nonexistent"}
    with pytest.raises(StackError, match="apptainer is not on PATH"):
        build_cluster_stack(shim_site.stack_request(tmp_path, environ=environ))
    (shim_site.venv / "bin" / "vllm").unlink()
    with pytest.raises(StackError, match=r"bin/vllm is not an executable: VLLM_VENV=.* no vLLM"):
        _build(shim_site, tmp_path)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--api-key", "x"], "--api-key would put the key in argv"),
        (["--port=8001"], "--port is set by pytest-haico"),
        (["-tp", "4"], "-tp is set by pytest-haico"),
    ],
)
def test_extra_args_may_not_carry_a_key_or_override_the_profiles_flags(
    shim_site: ShimSite, tmp_path: Path, extra: list[str], message: str
) -> None:
    arm = Arm.model_validate({**ARM.model_dump(), "vllm": {"extra_args": extra}})
    with pytest.raises(ConfigError, match=f"arms/qwen32b.toml: vllm.extra_args: {message}"):
        _build(shim_site, tmp_path, arm=arm)


def test_an_arm_without_weights_cannot_run_on_the_cluster(
    shim_site: ShimSite, tmp_path: Path
) -> None:
    with pytest.raises(ConfigError, match=r"arms/bare.toml: model: .* set \[model\] path"):
        _build(shim_site, tmp_path, arm=Arm.model_validate({"name": "bare"}))


@pytest.mark.parametrize(
    ("key", "default"), [("start_timeout_s", None), ("start_stall_timeout_s", 120.0)]
)
def test_the_start_timeouts_are_arm_settings_that_leave_the_item_id_alone(
    key: str, default: float | None
) -> None:
    script = Script.model_validate({"id": "s", "turns": [{"user": "Hi"}]})
    vllm = ARM.vllm.model_dump()
    patient = Arm.model_validate({**ARM.model_dump(), "vllm": {**vllm, key: 7200}})
    assert (getattr(ARM.vllm, key), getattr(patient.vllm, key)) == (default, 7200.0)
    ids = {item_id(arm, script, 0, model="m", backend="b") for arm in (ARM, patient)}
    assert len(ids) == 1  # raising it after a failed load reruns nothing
    for bad in (0, 86_401):
        with pytest.raises(ValidationError, match=rf"vllm\.{key}"):
            Arm.model_validate({"name": "x", "vllm": {key: bad}})
