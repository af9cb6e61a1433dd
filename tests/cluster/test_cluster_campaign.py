"""A whole campaign on the cluster profile, gates included: vLLM from the shim's venv,
Postgres and the backend through the Apptainer shim, run by pytest in an environment that
passes the static gates as a compute node of a running Slurm job does (this host in the
job's node list, the arm's GPUs visible, squeue and scontrol answering as Slurm's do)."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from pytest_haico.procfs import is_alive
from pytest_haico.stack import Orchestrator
from pytest_haico.stack.local import build_llm_service
from pytest_haico.stack.profiles import HttpService
from tests.cluster.compute_node import enter_compute_node, survivors
from tests.cluster.shim_site import (
    BACKEND_DIGEST,
    BACKEND_IMAGE,
    HOST_SECRET,
    SHIMS,
    ShimSite,
)
from tests.cluster.shim_site import scratch_site as make_scratch_site
from tests.harness import CONVERSATION_MODULE, CampaignProject
from tests.integration.test_gates_in_a_run import DYNAMIC, STATIC

JOB_ID = "731"
HOST = socket.gethostname()
SERVED_NAME = "qwen-test"
SCRIPTS = ("s1", "s2", "s3")
# A backend build given by --haico-backend-image: another digest of cluster.env's image.
OPTION_DIGEST = "5" * 64
OPTION_IMAGE = BACKEND_IMAGE.replace(BACKEND_DIGEST, OPTION_DIGEST)
OPTION_SIF = f"haico-backend-sha256-{OPTION_DIGEST}.sif"
SITE_SIF = f"haico-backend-sha256-{BACKEND_DIGEST}.sif"
# The stand-in backend as a developer's build run on the host (--haico-backend-cmd).
BACKEND_AS_COMMAND = (
    shlex.join([sys.executable, "-m", "pytest_haico.standins.backend", "--host", "127.0.0.1"])
    + " --port {port}"
)
SHARED_KEY = "the-shared-model-key-of-another-job"


@dataclass
class ClusterCampaign:
    """A campaign project whose arm serves real-looking weights, and the site it runs on."""

    project: CampaignProject
    site: ShimSite
    stacks_file: Path

    def run(self, *args: str, in_process: bool = False) -> pytest.RunResult:
        options = (
            *("--haico-profile", "cluster", "--haico-cluster-env", str(self.cluster_env)),
            # Not $CLUSTER_WORK/results (the site's): where the project's readers look.
            *("--haico-results", str(self.project.root / "results")),
        )
        if in_process:
            return self.project.run(*options, *args)
        return self.project.run_subprocess(*options, *args, timeout=600)

    @property
    def cluster_env(self) -> Path:
        return self.site.root / "cluster.env"

    def run_dir(self) -> Path:
        (path,) = sorted((self.project.arm_dir("demo") / "runs").iterdir())
        return path


def make_model_dir(directory: Path) -> Path:
    """A model directory as gate inputs_present reads it: config.json and a shard index whose
    shards exist (the shim's vLLM never loads them)."""
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    shards = [f"model-0000{i}-of-00002.safetensors" for i in (1, 2)]
    weight_map = {"lm_head.weight": shards[1], "model.embed_tokens.weight": shards[0]}
    index = {"metadata": {"total_size": 2}, "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    for shard in shards:
        (directory / shard).write_bytes(b"\0")
    return directory


@pytest.fixture
def cluster_campaign(
    campaign: CampaignProject, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> Iterator[ClusterCampaign]:
    """A campaign of one arm (TP 2, tool calling with hermes) and three scripts on a scratch
    site, in the environment of a compute node of Slurm job `JOB_ID`; parametrize
    indirectly with extra cluster.env lines."""
    lines: tuple[str, ...] = getattr(request, "param", ())
    with make_scratch_site(cluster_env_lines=lines) as site:
        model = make_model_dir(campaign.root / "models" / "Qwen2.5-Test-Instruct")
        campaign.arm(
            "demo",
            f"""
            [model]
            path = "{model}"
            served_name = "{SERVED_NAME}"
            [vllm]
            tensor_parallel_size = 2
            max_model_len = 8192
            enable_tool_calling = true
            tool_call_parser = "hermes"
            [generation]
            max_tokens = 512
            [run]
            concurrency = 2
            turn_timeout_s = 120
            """,
        )
        campaign.simple_scripts(*SCRIPTS)
        campaign.write("test_conversations.py", CONVERSATION_MODULE)
        stacks_file = enter_compute_node(
            campaign,
            monkeypatch,
            job_id=JOB_ID,
            host=HOST,
            gpus="0,1",
            path=site.environ["PATH"],  # the shims' bin dir next
            # A user's own key: it must reach no container and no results file.
            environ={"OPENAI_API_KEY": HOST_SECRET, "APPTAINERENV_OPENAI_API_KEY": HOST_SECRET},
        )
        yield ClusterCampaign(campaign, site, stacks_file)


def test_a_campaign_runs_on_the_cluster_profile_with_every_gate_passed_and_no_leak(
    cluster_campaign: ClusterCampaign,
) -> None:
    project = cluster_campaign.project
    result = cluster_campaign.run()
    output = result.stdout.str() + result.stderr.str()
    assert result.ret == 0, output
    records = project.records("demo")
    assert sorted(r["script"] for r in records) == sorted(SCRIPTS)
    assert [r["verdict"] for r in records] == ["completed"] * len(SCRIPTS), output
    model_dir = project.root / "models" / "Qwen2.5-Test-Instruct"
    assert {(r["model_identity"]["kind"], r["model_identity"]["path"]) for r in records} == {
        ("path", str(model_dir))
    }
    assert {json.dumps(r["backend_identity"]) for r in records} == {
        json.dumps({"kind": "image", "image": BACKEND_IMAGE, "header_sha256": None})
    }

    run = cluster_campaign.run_dir()
    gates = json.loads((run / "gates.json").read_text())
    assert (gates["passed"], gates["failed_gate"]) == (True, None)
    assert [gate["name"] for gate in gates["gates"]] == STATIC + DYNAMIC
    assert all(gate["passed"] for gate in gates["gates"])
    detail = {gate["name"]: gate["detail"] for gate in gates["gates"]}
    # The cluster profile's checks ran, not the local profile's "no check".
    assert detail["login_node"] == f"this host is a node of Slurm job {JOB_ID} ({HOST})"
    assert detail["parallel_width"] == "2 GPUs visible = TP 2 x DP 1"
    assert detail["one_node"] == "SLURM_JOB_NUM_NODES=1"
    assert "vllm 0.11.0" in detail["vllm_environment"]
    assert (
        f"apptainer at {cluster_campaign.site.bin_dir / 'apptainer'}"
        in (detail["vllm_environment"])
    )
    assert detail["inputs_present"] == (
        f"model {model_dir}: config.json + model.safetensors.index.json (2 shards); 2 images; "
        "1 script file readable"
    )

    config = dict(line.split("=", 1) for line in (run / "run-config.env").read_text().splitlines())
    assert config["OPTION_PROFILE"] == "cluster"
    # The haico-owned backend configuration, and the start timeout the item_id leaves out.
    assert {k: v for k, v in config.items() if k.startswith("BACKEND_CONFIG_")} == {
        "BACKEND_CONFIG_PHOENIX_ENABLED": "0",
        "BACKEND_CONFIG_HAICO_STUDY_ENABLED": "0",
        "BACKEND_CONFIG_HAICO_RATE_LIMIT_ENABLED": "0",
        "BACKEND_CONFIG_HAICO_MAX_TOKENS": config["ARM_GENERATION_MAX_TOKENS"],
    }
    # No deadline (empty, quoted for bash) while the log advances; two minutes of silence.
    assert (config["ARM_VLLM_START_TIMEOUT_S"], config["ARM_VLLM_START_STALL_TIMEOUT_S"]) == (
        "''",
        "120.0",
    )
    assert config["SLURM_JOB_ID"] == JOB_ID
    # The shim's `vllm serve` logs vLLM's start-up line, then execs the stand-in, which says
    # it is one.
    assert (config["MODEL_SERVER"], "VLLM_VERSION" in config) == ("standin", False)
    assert "'tensor_parallel_size': 2" in _run_config(run)["VLLM_NON_DEFAULT_ARGS"]
    assert config["CUDA_VISIBLE_DEVICES"] == "0,1"
    # vLLM was the venv's (the shim says what `vllm serve` was given), Postgres and the
    # backend ran from their SIFs through apptainer.
    llm_log = (run / "logs" / "llm.log").read_text()
    assert "'tensor_parallel_size': 2" in llm_log and "'tool_call_parser': 'hermes'" in llm_log
    backend_log = (run / "logs" / "backend.log").read_text()
    assert f"haico-backend-sha256-{BACKEND_DIGEST}.sif" in backend_log
    # The env files that handed Postgres and the backend their secrets went at stop.
    env_files = [
        Path(re.findall(r"--env-file (\S+)", (run / "logs" / f"{name}.log").read_text())[0])
        for name in ("postgres", "backend")
    ]
    assert not [path for path in env_files if path.exists()], env_files

    stacks = json.loads(cluster_campaign.stacks_file.read_text())
    assert set(stacks["pids"]) == {"llm", "postgres", "backend"}
    assert not survivors(stacks["pids"].values(), str(cluster_campaign.site.root))
    secrets = stacks["secrets"]
    # The model key, the admin token, Postgres' password and its read-only role's.
    assert len(secrets) == 4 and all(len(secret) >= 16 for secret in secrets)
    for needle in (*secrets, HOST_SECRET):
        assert needle not in output
        for path in project.root.joinpath("results").rglob("*"):
            if path.is_file():
                assert needle.encode() not in path.read_bytes(), path


def test_a_missing_backend_sif_fails_gate_inputs_present_before_anything_starts(
    cluster_campaign: ClusterCampaign,
) -> None:
    sif = cluster_campaign.site.sif_dir / f"haico-backend-sha256-{BACKEND_DIGEST}.sif"
    sif.unlink()
    result = cluster_campaign.run(in_process=True)
    assert result.ret == 78, result.stdout.str()
    result.stdout.fnmatch_lines(
        [
            f"gate failed (exit 78): arm demo: gate inputs_present failed: the image {sif} does "
            "not exist; pull the images first with `haico env` (every image the arms and "
            "cluster.env name, into SIF_DIR), or fix the path in cluster.env "
            "(BACKEND_IMAGE, POSTGRES_IMAGE, SIF_DIR) or --haico-backend-image"
        ]
    )
    assert cluster_campaign.project.records("demo") == []
    run = cluster_campaign.run_dir()
    assert not (run / "services.json").exists()
    gates = json.loads((run / "gates.json").read_text())
    assert (gates["passed"], gates["failed_gate"]) == (False, "inputs_present")
    assert [gate["name"] for gate in gates["gates"]] == STATIC[: STATIC.index("inputs_present") + 1]


def test_an_arm_asking_for_the_gpu_check_fails_gate_gpu_check_before_vllm_loads(
    cluster_campaign: ClusterCampaign,
) -> None:
    site = cluster_campaign.site
    shutil.copy2(SHIMS / "nvidia-smi", site.bin_dir / "nvidia-smi")
    card = {"utilization": 0, "power": 61.0, "temperature": 31, "ecc": 0}
    gpus = [{"index": index, "uuid": f"GPU-{index}", **card} for index in range(2)]
    (site.bin_dir / "nvidia-smi.json").write_text(json.dumps({"gpus": gpus}))
    # This interpreter has no torch: the burn cannot drive a card, as on a broken node.
    (site.venv / "bin" / "python").symlink_to(sys.executable)
    [arm] = cluster_campaign.project.root.rglob("arms/demo.toml")
    arm.write_text(arm.read_text().replace("[run]\n", "[run]\ngpu_check = true\n"))
    result = cluster_campaign.run(in_process=True)
    assert result.ret == 78, result.stdout.str()
    result.stdout.fnmatch_lines(
        [
            # `[[]` is fnmatch's literal `[`.
            "gate failed (exit 78): arm demo: gate gpu_check failed: * device 0: * samples "
            "(max 31 C, 61 W, ECC 0); FAILED: the burn on device 0 failed (exit 1): RuntimeError: "
            "torch is not importable, and numpy cannot use cuda:0; * device 1: *; resubmit away "
            "from this node (sbatch --exclude=<node>) and report it to the cluster's admins, or "
            "set [[]run] gpu_check = false to run without the check"
        ]
    )
    assert cluster_campaign.project.records("demo") == []
    run = cluster_campaign.run_dir()
    assert not (run / "services.json").exists()  # vLLM never started
    gates = json.loads((run / "gates.json").read_text())
    assert gates["failed_gate"] == "gpu_check"
    assert [gate["name"] for gate in gates["gates"]] == [*STATIC, "gpu_check"]
    assert list((run / "logs").glob("gpu-*.csv"))


@pytest.mark.parametrize(
    "cluster_campaign",
    [("BACKEND_IMAGE=docker://ghcr.io/example/haico-backend:latest",)],
    indirect=True,
    ids=["tag"],
)
def test_an_image_not_pinned_by_digest_fails_gate_inputs_present_naming_the_fix(
    cluster_campaign: ClusterCampaign,
) -> None:
    result = cluster_campaign.run(in_process=True)
    assert result.ret == 78, result.stdout.str()
    result.stdout.fnmatch_lines(
        [
            "gate failed (exit 78): arm demo: gate inputs_present failed: cannot locate the "
            f"images to run: {cluster_campaign.cluster_env}: image: "
            "'docker://ghcr.io/example/haico-backend:latest' is neither pinned by digest*; "
            "set POSTGRES_IMAGE and BACKEND_IMAGE (and PHOENIX_IMAGE with PHOENIX_ENABLED=1) "
            "in cluster.env*"
        ]
    )
    gates = json.loads((cluster_campaign.run_dir() / "gates.json").read_text())
    assert gates["failed_gate"] == "inputs_present"


def test_a_stack_the_cluster_profile_cannot_build_ends_the_run_with_exit_78(
    cluster_campaign: ClusterCampaign,
) -> None:
    # The gates pass; building the stack refuses a flag the profile sets itself.
    arm = cluster_campaign.project.experiments / "arms" / "demo.toml"
    arm.write_text(arm.read_text().replace("[vllm]\n", '[vllm]\nextra_args = ["--port=9000"]\n'))
    result = cluster_campaign.run(in_process=True)
    assert result.ret == 78, result.stdout.str()
    result.stdout.fnmatch_lines(
        [
            "*the stack of arm demo did not start: ConfigError: arms/demo.toml: vllm.extra_args: "
            "--port is set by pytest-haico from the arm's other fields; remove it"
        ]
    )
    assert cluster_campaign.project.records("demo") == []
    gates = json.loads((cluster_campaign.run_dir() / "gates.json").read_text())
    assert [gate["name"] for gate in gates["gates"]] == STATIC
    assert gates["passed"]


def _log_header(run: Path, service: str) -> str:
    """The first line of a service's log: when it started, and its argv."""
    return (run / "logs" / f"{service}.log").read_text().splitlines()[0]


def _run_config(run: Path) -> dict[str, str]:
    """run-config.env read as bash would (a value with a space is quoted)."""
    pairs = [line.partition("=") for line in (run / "run-config.env").read_text().splitlines()]
    return {key: "".join(shlex.split(value)) for key, _, value in pairs}


def _check_no_leak(
    cluster_campaign: ClusterCampaign, output: str, services: set[str], *extra: str
) -> None:
    """The services of the session's stack were `services`, none of them (nor their
    children) is left, and no secret of the stack, nor `extra`, is in the output or results."""
    stacks = json.loads(cluster_campaign.stacks_file.read_text())
    assert set(stacks["pids"]) == services
    assert not survivors(stacks["pids"].values(), str(cluster_campaign.site.root))
    secrets = stacks["secrets"]
    assert len(secrets) == 4 and all(len(secret) >= 16 for secret in secrets)
    for needle in (*secrets, HOST_SECRET, *extra):
        assert needle not in output
        for path in cluster_campaign.project.root.joinpath("results").rglob("*"):
            if path.is_file():
                assert needle.encode() not in path.read_bytes(), path


def _ledger_status(cluster_campaign: ClusterCampaign, *args: str) -> str:
    """What a collection of the campaign with `args` says is done and to run (no stack)."""
    result = cluster_campaign.run("--collect-only", "-q", *args, in_process=True)
    # 5: every item was deselected as done.
    assert result.ret in (0, 5), result.stdout.str()
    (line,) = [line for line in result.stdout.lines if " done in ledger, " in line]
    return line


def test_the_backend_image_option_runs_its_build_and_gives_it_its_own_item_ids(
    cluster_campaign: ClusterCampaign,
) -> None:
    site = cluster_campaign.site
    # The option's build is pulled; cluster.env names another one, whose SIF is gone: the
    # option's wins, and the other is not needed.
    shutil.copy2(site.sif_dir / SITE_SIF, site.sif_dir / OPTION_SIF)
    (site.sif_dir / SITE_SIF).unlink()
    project = cluster_campaign.project

    result = cluster_campaign.run("--haico-backend-image", OPTION_IMAGE)
    output = result.stdout.str() + result.stderr.str()
    assert result.ret == 0, output
    records = project.records("demo")
    assert [r["verdict"] for r in records] == ["completed"] * len(SCRIPTS), output
    assert {r["backend_identity"]["image"] for r in records} == {OPTION_IMAGE}
    run = cluster_campaign.run_dir()
    gates = json.loads((run / "gates.json").read_text())
    assert gates["passed"] and all(gate["passed"] for gate in gates["gates"])
    # The option's SIF ran the backend, through apptainer.
    header = _log_header(run, "backend")
    assert f"{site.bin_dir / 'apptainer'} exec " in header
    assert str(site.sif_dir / OPTION_SIF) in header and SITE_SIF not in header
    assert _run_config(run)["BACKEND_IDENTITY"] == f"image:{OPTION_IMAGE}"
    _check_no_leak(cluster_campaign, output, {"llm", "postgres", "backend"})

    # Another build (cluster.env's, another digest of the same repository's image): other
    # item ids, none done.
    none_done = f"haico: 0 done in ledger, {len(SCRIPTS)} to run (0 retries)"
    assert _ledger_status(cluster_campaign) == none_done
    # The same build, however it is named: the same item ids, all done. cluster.env with no
    # BACKEND_IMAGE, then with the option's image in it (and no option).
    done = f"haico: {len(SCRIPTS)} done in ledger, 0 to run (0 retries)"
    lines = cluster_campaign.cluster_env.read_text().splitlines()
    kept = [line for line in lines if not line.startswith("BACKEND_IMAGE=")]
    cluster_campaign.cluster_env.write_text("\n".join(kept) + "\n")
    assert _ledger_status(cluster_campaign, "--haico-backend-image", OPTION_IMAGE) == done
    with cluster_campaign.cluster_env.open("a") as handle:
        handle.write(f"BACKEND_IMAGE={OPTION_IMAGE}\n")
    assert _ledger_status(cluster_campaign) == done


def test_the_backend_command_runs_on_the_host_on_the_cluster_profile(
    cluster_campaign: ClusterCampaign,
) -> None:
    site = cluster_campaign.site
    (site.sif_dir / SITE_SIF).unlink()  # the command replaces the backend's image
    project = cluster_campaign.project

    result = cluster_campaign.run("--haico-backend-cmd", BACKEND_AS_COMMAND)
    output = result.stdout.str() + result.stderr.str()
    assert result.ret == 0, output
    records = project.records("demo")
    assert [r["verdict"] for r in records] == ["completed"] * len(SCRIPTS), output
    assert {
        (r["backend_identity"]["command"], r["backend_identity"]["git_commit"]) for r in records
    } == {(BACKEND_AS_COMMAND, None)}
    result.stdout.fnmatch_lines(["*--haico-backend-cmd runs in *not a git checkout*"])
    run = cluster_campaign.run_dir()
    gates = json.loads((run / "gates.json").read_text())
    assert gates["passed"] and all(gate["passed"] for gate in gates["gates"])
    detail = {gate["name"]: gate["detail"] for gate in gates["gates"]}
    assert detail["inputs_present"].endswith("; 1 image; 1 script file readable")
    # The backend ran on the host, no apptainer; Postgres still from its image.
    backend = _log_header(run, "backend")
    assert backend.endswith(f": {BACKEND_AS_COMMAND.split(' --port')[0]} --port {_port(backend)}")
    assert "apptainer" not in backend
    assert "apptainer" in _log_header(run, "postgres")
    config = _run_config(run)
    assert config["BACKEND_IDENTITY"] == f"cmd:{BACKEND_AS_COMMAND};git:none"
    _check_no_leak(cluster_campaign, output, {"llm", "postgres", "backend"})


def _port(header: str) -> str:
    match = re.search(r" port (\d+) attempt ", header)
    assert match is not None, header
    return match[1]


@pytest.fixture
def served_model(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpService]:
    """A stand-in model server serving the arm's model, started by hand as another user's
    served-model job would run it."""
    root = tmp_path_factory.mktemp("shared-llm")
    llm = build_llm_service(
        served_name=SERVED_NAME,
        max_model_len=8192,
        tool_call_parser="hermes",
        persona="helpful",
        latency_ms=0,
        seed=0,
        api_key=SHARED_KEY,
        name="shared-llm",
    )
    with Orchestrator([llm], root / "logs", state_dir=root / "state"):
        yield llm


def test_a_cluster_campaign_attaches_to_a_served_model_without_starting_vllm(
    cluster_campaign: ClusterCampaign,
    served_model: HttpService,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    site = cluster_campaign.site
    # A tripwire in front of the vLLM shim; a CPU job (no GPU), no weights on this node.
    vllm = site.venv / "bin" / "vllm"
    vllm.rename(vllm.with_name("vllm-shim"))
    tripwire = site.root / "vllm-ran"
    vllm.write_text(f'#!/bin/sh\ntouch {tripwire}\nexec "$0-shim" "$@"\n')
    vllm.chmod(0o755)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    model_dir = cluster_campaign.project.root / "models" / "Qwen2.5-Test-Instruct"
    shutil.rmtree(model_dir)
    monkeypatch.setenv("HAICO_MODEL_API_KEY", SHARED_KEY)
    endpoint = f"http://vllm.localhost:{served_model.port}/v1"
    project = cluster_campaign.project

    result = cluster_campaign.run("--haico-model-endpoint", endpoint)
    output = result.stdout.str() + result.stderr.str()
    assert result.ret == 0, output
    records = project.records("demo")
    assert [r["verdict"] for r in records] == ["completed"] * len(SCRIPTS), output
    assert [r["model_identity"] for r in records] == [
        {"kind": "endpoint", "endpoint": endpoint, "served_name": SERVED_NAME}
    ] * len(records)
    assert not tripwire.exists()
    run = cluster_campaign.run_dir()
    assert not (run / "logs" / "llm.log").exists()
    gates = json.loads((run / "gates.json").read_text())
    assert [gate["name"] for gate in gates["gates"]] == STATIC + DYNAMIC
    assert gates["passed"] and all(gate["passed"] for gate in gates["gates"])
    detail = {gate["name"]: gate["detail"] for gate in gates["gates"]}
    # What only matters when vLLM starts here is not checked: GPUs, venv, weights, parser.
    assert detail["parallel_width"] == "no vLLM started here: no GPU check"
    assert detail["vllm_environment"] == f"apptainer at {site.bin_dir / 'apptainer'}"
    assert detail["inputs_present"] == "2 images; 1 script file readable"
    assert detail["tool_calling_flags"].endswith("(parser not checked: no vLLM venv)")
    assert detail["login_node"] == f"this host is a node of Slurm job {JOB_ID} ({HOST})"
    # The backend still ran from its image, pointed at the served model.
    assert SITE_SIF in _log_header(run, "backend")
    config = _run_config(run)
    assert config["MODEL_ENDPOINT"] == endpoint
    _check_no_leak(cluster_campaign, output, {"postgres", "backend"}, SHARED_KEY)


def test_a_kept_cluster_stack_serves_attached_runs_until_down(
    cluster_campaign: ClusterCampaign, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = cluster_campaign.project
    (project.experiments / "conftest.py").unlink()  # it reads stacks this run starts
    tmpdir = Path(tempfile.mkdtemp(prefix="haico-kept-cluster-"))
    tmpdir.chmod(0o711)  # Postgres, run as another user, reaches its data by name
    monkeypatch.setenv("TMPDIR", str(tmpdir))
    state = tmpdir / f"pytest-haico-{os.getuid()}" / "stacks" / "demo.json"

    def haico(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "pytest_haico", "stack", *args],
            cwd=project.root,
            capture_output=True,
            text=True,
            timeout=300,
        )

    try:
        up = haico(
            "up", "demo", "--profile", "cluster",
            "--cluster-env", str(cluster_campaign.cluster_env),
            "--results", str(project.root / "results"),
        )  # fmt: skip
        assert up.returncode == 0, up.stdout + up.stderr
        kept = json.loads(state.read_text())
        assert (kept["profile"], kept["allocation"]) == ("cluster", JOB_ID)
        assert kept["serves"]["backend"] == {"image": BACKEND_IMAGE}
        pids = {s["name"]: s["pid"] for s in kept["services"]}
        assert set(pids) == {"llm", "postgres", "backend"}

        first = cluster_campaign.run("--haico-attach", str(state))
        assert first.ret == 0, first.stdout.str() + first.stderr.str()
        again = cluster_campaign.run("--haico-attach", str(state), "--haico-no-resume", "-k", "s1")
        assert again.ret == 0, again.stdout.str() + again.stderr.str()
        records = project.records("demo")
        assert sorted(r["script"] for r in records) == ["s1", "s1", "s2", "s3"]
        assert {r["verdict"] for r in records} == {"completed"}
        assert {r["model_identity"]["kind"] for r in records} == {"path"}
        assert {s["name"]: s["pid"] for s in json.loads(state.read_text())["services"]} == pids
        assert all(is_alive(pid) for pid in pids.values())

        other = cluster_campaign.run(
            "--haico-attach", str(state), "--haico-backend-image", OPTION_IMAGE
        )
        assert other.ret == pytest.ExitCode.USAGE_ERROR
        other.stderr.fnmatch_lines(
            [f"*changed what the kept stack serves*backend.image: *{OPTION_DIGEST}*"]
        )
        local = cluster_campaign.project.run_subprocess("--haico-attach", str(state))
        assert local.ret == pytest.ExitCode.USAGE_ERROR
        local.stderr.fnmatch_lines(
            ["*the kept stack runs the cluster profile: add --haico-profile cluster"]
        )

        down = haico("down", "demo")
        assert down.returncode == 0, down.stdout + down.stderr
        assert not any(is_alive(pid) for pid in pids.values())
    finally:
        if state.exists():
            pid = json.loads(state.read_text())["supervisor_pid"]
            if is_alive(pid):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(tmpdir, ignore_errors=True)
