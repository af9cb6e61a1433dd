"""A campaign on the cluster profile whose arm serves the tier's model: real vLLM from the
tier's venv as `VLLM_VENV`, Postgres and the stand-in backend (LangGraph and ChatOpenAI, as the
real one) through the Apptainer shim, on a compute node of a fake Slurm job; run by pytest in
a subprocess, as `sbatch/campaign.sbatch` runs it."""

from __future__ import annotations

import contextlib
import json
import shlex
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.compute_node import enter_compute_node, survivors
from tests.cluster.shim_site import ShimSite, scratch_site
from tests.harness import CONVERSATION_MODULE, BackgroundRun, CampaignProject
from tests.vllm.real_vllm import CPU_EXTRA_ARGS, MAX_MODEL_LEN, tier_environment
from tests.vllm.setup_tier import Manifest

JOB_ID = "4242"
HOST = socket.gethostname()
ARM = "smol"
# A turn the model answers in a few seconds on one core (the backend's max_tokens is small).
MAX_TOKENS = 48
# Far beyond a turn of this model: a test that waits for it cannot pass.
TURN_TIMEOUT_S = 600


@dataclass
class VllmCampaign:
    """The campaign project, the site it runs on, and what its runs left."""

    project: CampaignProject
    site: ShimSite
    manifest: Manifest
    stacks_file: Path

    @property
    def cluster_env(self) -> Path:
        return self.site.root / "cluster.env"

    def arm(
        self,
        *,
        tools: bool = True,
        served_name: str | None = None,
        max_model_len: int = MAX_MODEL_LEN,
        concurrency: int = 3,
    ) -> None:
        """The arm file: the tier's model from its directory, CPU flags, a small max_tokens."""
        tool_lines = 'enable_tool_calling = true\ntool_call_parser = "hermes"'
        if not tools:
            tool_lines = "enable_tool_calling = false"
        self.project.arm(
            ARM,
            f"""
            [model]
            path = "{self.manifest.model}"
            served_name = "{served_name or self.manifest.served_name}"
            [vllm]
            max_model_len = {max_model_len}
            {tool_lines}
            extra_args = {json.dumps(list(CPU_EXTRA_ARGS))}
            [generation]
            max_tokens = {MAX_TOKENS}
            [agent]
            recursion_limit = 6
            [run]
            concurrency = {concurrency}
            turn_timeout_s = {TURN_TIMEOUT_S}
            """.replace("\n            ", "\n"),
        )

    def scripts(self, count: int, *, turns: int) -> None:
        """`count` scripts of `turns` turns each, asking about a place."""
        places = ("Crete", "Lisbon", "Kyoto", "Quito", "Oslo", "Dakar", "Hobart", "Lima")
        lines = []
        for index in range(count):
            place = places[index % len(places)]
            talk = [{"user": f"Tell me one fact about {place}."}]
            talk += [{"user": f"And one more fact about {place}, please."}] * (turns - 1)
            lines.append(json.dumps({"id": f"s{index}", "turns": talk}))
        self.project.scripts("places.jsonl", "\n".join(lines) + "\n")

    def options(self, *args: str) -> tuple[str, ...]:
        return (
            *("--haico-profile", "cluster", "--haico-cluster-env", str(self.cluster_env)),
            *("--haico-results", str(self.project.root / "results")),
            *args,
        )

    def run(self, *args: str, timeout: float = 1200) -> pytest.RunResult:
        """pytest in a subprocess, with the cluster profile."""
        return self.project.run_subprocess(*self.options(*args), timeout=timeout)

    def start(self, *args: str) -> BackgroundRun:
        """pytest in the background, for a test to signal, or to kill a service under."""
        return self.project.start(*self.options(*args))

    def run_dir(self) -> Path:
        (path,) = sorted((self.project.arm_dir(ARM) / "runs").iterdir())
        return path

    def records(self) -> list[dict[str, Any]]:
        return self.project.records(ARM)

    def gates(self) -> dict[str, Any]:
        gates: dict[str, Any] = json.loads((self.run_dir() / "gates.json").read_text())
        return gates

    def run_config(self) -> dict[str, Any]:
        config: dict[str, Any] = json.loads((self.run_dir() / "run-config.json").read_text())
        return config

    def services(self) -> dict[str, int]:
        """Service name -> pid, of the run's stack (from its services.json)."""
        registry = json.loads((self.run_dir() / "services.json").read_text())
        return {s["name"]: s["pid"] for s in registry["services"] if s.get("pid")}

    def left_behind(self) -> list[str]:
        """Processes of the session's stacks still alive: a service, or anything in its
        process session (vLLM's engine core is in the API server's)."""
        stacks = json.loads(self.stacks_file.read_text())
        return survivors(stacks["pids"].values(), str(self.site.root))


def log_header_argv(log: Path) -> list[str]:
    """The argv a service's log header says it was spawned with."""
    header = log.read_text().splitlines()[0]
    return shlex.split(header.split(": ", 1)[1])


@contextlib.contextmanager
def prepare_tier_campaign(
    project: CampaignProject, manifest: Manifest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[VllmCampaign]:
    """The project on a scratch site whose VLLM_VENV is the tier's, in the environment of a
    compute node of Slurm job `JOB_ID` with one (CPU) "GPU", and vLLM's CPU variables."""
    with scratch_site(cluster_env_lines=(f"VLLM_VENV={manifest.venv}",)) as site:
        project.write("test_conversations.py", CONVERSATION_MODULE)
        stacks_file = enter_compute_node(
            project,
            monkeypatch,
            job_id=JOB_ID,
            host=HOST,
            gpus="0",  # TP 1 x DP 1: gate parallel_width counts one
            path=site.environ["PATH"],
            environ=tier_environment(manifest),
        )
        yield VllmCampaign(project, site, manifest, stacks_file)
