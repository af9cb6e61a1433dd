"""An arm's stack on its profile: what a run starts, and what `haico stack up` keeps; and
its model server alone, as `haico serve` serves it."""

from __future__ import annotations

import os
from collections.abc import Mapping

from pytest_haico.config.cluster_env import ClusterEnv
from pytest_haico.config.cluster_site import resolve_cluster_site
from pytest_haico.config.experiment import Arm
from pytest_haico.config.settings import Profile
from pytest_haico.errors import ConfigError
from pytest_haico.stack.cluster import build_cluster_stack, build_vllm_service
from pytest_haico.stack.local import build_arm_llm_service, build_local_stack
from pytest_haico.stack.profiles import HttpService, Stack
from pytest_haico.stack.request import StackRequest


def build_arm_stack(request: StackRequest) -> Stack:
    """The services of `request.arm` on `request.profile`, not yet started; their logs in
    `<run_dir>/logs`, their registry mirrored to `<run_dir>/services.json`."""
    if request.profile is Profile.CLUSTER:
        return build_cluster_stack(request)
    return build_local_stack(request)


def build_model_service(
    arm: Arm,
    *,
    profile: Profile,
    api_key: str,
    site: ClusterEnv | None = None,
    environ: Mapping[str, str] | None = None,
    host: str = "127.0.0.1",
) -> HttpService:
    """The arm's model server on `host`, as its stack would start it (not yet started): vLLM
    from the site's venv on the cluster profile, the stand-in on the local one."""
    if profile is Profile.LOCAL:
        return build_arm_llm_service(arm, api_key=api_key, host=host)
    environ = os.environ if environ is None else environ
    resolved = resolve_cluster_site(site, environ)
    if resolved.vllm_venv is None:
        raise ConfigError(
            resolved.source, "VLLM_VENV", "not set: the cluster profile starts vLLM from it"
        )
    return build_vllm_service(
        arm,
        venv=resolved.vllm_venv,
        api_key=api_key,
        environ=environ,
        hf_home=resolved.hf_home,
        host=host,
    )
