"""Real ``vllm serve`` from the tier, started for tests the way the cluster profile starts it:
an arm for the tier's model, the environment a site hands vLLM, the tier's skip (or, in CI,
its failure)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from pytest_haico.config.experiment import Arm
from pytest_haico.stack import Orchestrator
from pytest_haico.stack.cluster import build_vllm_service
from tests.standins.standin_procs import base_env
from tests.vllm.setup_tier import SETUP_COMMAND, Manifest, read_manifest, tier_dir

# Set (to 1) where a missing tier must fail the tests instead of skipping them: CI.
REQUIRE_TIER_ENV = "HAICO_REQUIRE_VLLM_TIER"
MAX_MODEL_LEN = 2048
# What a CPU build needs besides the tier's own variables, on a machine that other work
# shares: a 1 GiB KV cache (vLLM sizes it from the RAM otherwise); one OpenMP thread that
# the kernel may move (vLLM binds its worker to core 0, every vLLM to the same core); and
# the model in the engine core's process, as vLLM runs one GPU (its CPU platform otherwise
# starts a worker process, and the engine core busy-polls it for a second after every
# step: twice the CPU of generating, for the same tokens in the same time).
SERVE_ENVIRONMENT = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "OMP_NUM_THREADS": "1",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
}
# Flags the cluster profile does not set and a CPU build needs (`check_extra_args` allows them).
CPU_EXTRA_ARGS = ("--dtype", "float32", "--enforce-eager")


@dataclass(frozen=True)
class VllmServer:
    """A real vLLM started by the cluster profile's model service: its address and start-up."""

    base_url: str
    log: Path
    healthy_after_s: float
    scratch_dir: Path | None  # its $TMPDIR, private to it, removed at its stop


def manifest_or_skip() -> Manifest:
    """The tier's manifest; `pytest.skip` naming the set-up command where there is none
    (`pytest.fail` where $HAICO_REQUIRE_VLLM_TIER is set: CI never counts a skip as done)."""
    manifest = read_manifest()
    if manifest is None:
        reason = f"the real-vLLM tier is not set up in {tier_dir()}: run `{SETUP_COMMAND}`"
        if os.environ.get(REQUIRE_TIER_ENV):
            pytest.fail(f"{reason} ({REQUIRE_TIER_ENV} is set)", pytrace=False)
        pytest.skip(reason)
    return manifest


def tier_arm(
    manifest: Manifest, name: str = "smol", *, tools: bool = True, **sections: dict[str, Any]
) -> Arm:
    """An arm serving the tier's model from its directory, as an arm file would, with the
    tool flags or without them; `sections` adds to (or replaces keys of) its sections."""
    vllm: dict[str, Any] = {
        "max_model_len": MAX_MODEL_LEN,
        "enable_tool_calling": tools,
        "tool_call_parser": "hermes" if tools else None,
        "extra_args": list(CPU_EXTRA_ARGS),
    }
    fields: dict[str, Any] = {
        "model": {"path": manifest.model, "served_name": manifest.served_name},
        "vllm": vllm,
        "generation": {"max_tokens": 64},
    }
    for section, values in sections.items():
        fields[section] = {**fields.get(section, {}), **values}
    return Arm.model_validate({"name": name, **fields})


def tier_environment(manifest: Manifest) -> dict[str, str]:
    """What a site sets for the tier's vLLM: the tier's variables, `SERVE_ENVIRONMENT`, and
    vLLM's cache in the tier, as a user's is in their home whatever a test makes $HOME
    (pytester's runs get a new one: vLLM then inspected the model again in a process of its
    own, 11 s of CPU each start)."""
    cache = Path(manifest.venv).parent / "vllm-cache"
    return {**manifest.environment, **SERVE_ENVIRONMENT, "VLLM_CACHE_ROOT": str(cache)}


def serve_environ(manifest: Manifest) -> dict[str, str]:
    """The host environment the cluster profile hands vLLM (it drops what vLLM must not
    get): this one without its secrets, plus `tier_environment`."""
    return {**base_env(), **tier_environment(manifest)}


@contextlib.contextmanager
def running_vllms(
    manifest: Manifest,
    *,
    root: Path,
    api_key: str,
    arms: Sequence[Arm],
    environ: Mapping[str, str] | None = None,
) -> Iterator[list[VllmServer]]:
    """One real vLLM per arm, built by `build_vllm_service` and started together by an
    `Orchestrator` (each waited for by its process and its log), all stopped at the end
    (the process group: API server and engine core), whatever happened."""
    environ = serve_environ(manifest) if environ is None else environ
    services = [
        replace(
            build_vllm_service(
                arm, venv=Path(manifest.venv), api_key=api_key, environ=environ, hf_home=None
            ),
            name=f"llm-{arm.name}",
        )
        for arm in arms
    ]
    with Orchestrator(services, root / "logs", state_dir=root / "state") as stack:
        yield [
            VllmServer(
                base_url=service.url,
                log=stack.log_path(service.name),
                healthy_after_s=stack.timings[service.name].healthy,
                scratch_dir=service.scratch_dir,
            )
            for service in services
        ]
