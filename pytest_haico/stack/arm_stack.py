"""An arm's stack on its profile: what a run starts, and what `haico stack up` keeps."""

from __future__ import annotations

from pathlib import Path

from pytest_haico.config.cluster_env import ClusterEnv
from pytest_haico.config.experiment import Arm
from pytest_haico.config.settings import Profile
from pytest_haico.stack.cluster import build_cluster_stack
from pytest_haico.stack.profiles import BackendCommand, ModelEndpoint, Stack, build_local_stack


def build_arm_stack(
    arm: Arm,
    run_dir: Path,
    *,
    profile: Profile,
    site: ClusterEnv | None = None,
    backend_image: str | None = None,
    backend_command: BackendCommand | None = None,
    model_endpoint: ModelEndpoint | None = None,
    log_mode: int = 0o640,
) -> Stack:
    """The services of `arm`, not yet started; their logs in `<run_dir>/logs`, their
    registry mirrored to `<run_dir>/services.json`."""
    if profile is Profile.CLUSTER:
        return build_cluster_stack(
            run_dir / "logs",
            arm=arm,
            site=site,
            backend_image=backend_image,
            backend_command=backend_command,
            model_endpoint=model_endpoint,
            registry_mirror=run_dir / "services.json",
            log_mode=log_mode,
        )
    return build_local_stack(
        run_dir / "logs",
        served_name=arm.served_name,
        max_model_len=arm.vllm.max_model_len,
        enable_tool_calling=arm.vllm.enable_tool_calling,
        tool_call_parser=arm.vllm.tool_call_parser,
        persona=arm.standin.persona,
        latency_ms=arm.standin.latency_ms,
        load_s=arm.standin.load_s,
        seed=arm.standin.seed,
        substitute_model=arm.standin.substitute_model or None,
        rate_limit_rpm=arm.standin.rate_limit_rpm or None,
        recursion_flag=arm.standin.recursion_flag,
        backend_command=backend_command,
        model_endpoint=model_endpoint,
        registry_mirror=run_dir / "services.json",
        log_mode=log_mode,
    )
