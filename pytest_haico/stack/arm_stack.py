"""An arm's stack on its profile: what a run starts, and what `haico stack up` keeps."""

from __future__ import annotations

from pytest_haico.config.settings import Profile
from pytest_haico.stack.cluster import build_cluster_stack
from pytest_haico.stack.local import build_local_stack
from pytest_haico.stack.profiles import Stack
from pytest_haico.stack.request import StackRequest


def build_arm_stack(request: StackRequest) -> Stack:
    """The services of `request.arm` on `request.profile`, not yet started; their logs in
    `<run_dir>/logs`, their registry mirrored to `<run_dir>/services.json`."""
    if request.profile is Profile.CLUSTER:
        return build_cluster_stack(request)
    return build_local_stack(request)
