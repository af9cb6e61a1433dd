"""Fixtures of the real-vLLM tier: the tier (or a skip), real vLLM, the stand-in beside it."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from tests.harness import CampaignProject
from tests.standins.standin_http import API_KEY, MODEL
from tests.standins.standin_procs import LlmServers
from tests.vllm.real_vllm import (
    MAX_MODEL_LEN,
    VllmServer,
    manifest_or_skip,
    running_vllms,
    tier_arm,
)
from tests.vllm.servers import Server, ServerPair
from tests.vllm.setup_tier import Manifest
from tests.vllm.vllm_campaign import VllmCampaign, prepare_tier_campaign

# The release the stand-in imitates here: the one the tier installs.
STANDIN_VLLM_VERSION = "0.32.0"


@pytest.fixture(scope="session")
def vllm_tier() -> Manifest:
    """The real-vLLM tier's manifest; skips the test where the tier is not set up."""
    return manifest_or_skip()


@pytest.fixture(scope="session")
def real_vllm(
    vllm_tier: Manifest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerPair]:
    """Two real vLLMs from the tier, started once by the cluster profile's model service:
    with the tool flags and without them."""
    api_key = "test-vllm-key-" + uuid.uuid4().hex
    arms = [tier_arm(vllm_tier, "tools"), tier_arm(vllm_tier, "plain", tools=False)]
    root = tmp_path_factory.mktemp("real-vllm")
    with running_vllms(vllm_tier, root=root, api_key=api_key, arms=arms) as (tools, plain):

        def server(vllm: VllmServer) -> Server:
            return Server(
                kind="vllm",
                base_url=vllm.base_url,
                api_key=api_key,
                model=vllm_tier.served_name,
                root=vllm_tier.model,
                max_model_len=MAX_MODEL_LEN,
                version=vllm_tier.vllm_version,
                scratch_dir=vllm.scratch_dir,
            )

        took = f"{tools.healthy_after_s:.1f} s and {plain.healthy_after_s:.1f} s"
        print(f"real vLLM (with and without the tool flags) healthy after {took}")
        pair = ServerPair(tools=server(tools), plain=server(plain))
        yield pair
        pair.close()


@pytest.fixture(scope="session")
def standin_vllm(llm_server: LlmServers) -> Iterator[ServerPair]:
    """Two stand-in vLLMs imitating the tier's release: with the tool flags and without them."""
    common = {"max_model_len": MAX_MODEL_LEN, "vllm_version": STANDIN_VLLM_VERSION}
    tools, plain = llm_server.prefetch(
        [("helpful", common), ("helpful", {**common, "tools": False})]
    )

    def server(base_url: str) -> Server:
        return Server(
            kind="standin",
            base_url=base_url,
            api_key=API_KEY,
            model=MODEL,
            root=MODEL,
            max_model_len=MAX_MODEL_LEN,
            version=STANDIN_VLLM_VERSION,
        )

    pair = ServerPair(tools=server(tools.base_url), plain=server(plain.base_url))
    yield pair
    pair.close()


@pytest.fixture(
    scope="session",
    params=[
        pytest.param("standin"),
        pytest.param("vllm", marks=pytest.mark.vllm),
    ],
)
def servers(request: pytest.FixtureRequest) -> ServerPair:
    """The stand-in, then real vLLM (marked ``vllm``): each test of the contract runs on both."""
    fixture = "standin_vllm" if request.param == "standin" else "real_vllm"
    pair: ServerPair = request.getfixturevalue(fixture)
    return pair


@pytest.fixture
def tier_campaign(
    campaign: CampaignProject, vllm_tier: Manifest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[VllmCampaign]:
    """A cluster-profile campaign project whose arm serves the tier's model (no arm or
    scripts yet), on a scratch site with VLLM_VENV the tier's, on a fake Slurm job's node."""
    with prepare_tier_campaign(campaign, vllm_tier, monkeypatch) as project:
        yield project
