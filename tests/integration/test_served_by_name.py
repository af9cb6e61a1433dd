"""A run attached to a served model by name (`[model] served`): the summary and run-config
say which served model answered, by its catalogue name and its job."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_haico.config.experiment import load_experiments
from pytest_haico.config.identity import model_identity
from pytest_haico.config.settings import Profile
from pytest_haico.serve.catalogue import (
    CatalogueEntry,
    EntryJob,
    EntryOwner,
    ServedIdentity,
    key_file_name,
    now_utc,
    register,
)
from pytest_haico.stack import Orchestrator
from pytest_haico.stack.local import build_llm_service
from pytest_haico.stack.profiles import HttpService
from tests.harness import CONVERSATION_MODULE, CampaignProject

KEY = "the-served-key"
JOB, NODE = "4711", "gpu07"
ARM = "[model]\nserved = 'shared'\nserved_name = 'shared-model'\n"


@pytest.fixture
def served_model(tmp_path: Path) -> Iterator[HttpService]:
    """A stand-in model server, as `haico serve`'s job would run it."""
    llm = build_llm_service(
        served_name="shared-model",
        max_model_len=8192,
        tool_call_parser="hermes",
        persona="helpful",
        latency_ms=0,
        seed=0,
        api_key=KEY,
        name="shared-llm",
    )
    with Orchestrator([llm], tmp_path / "shared-llm-logs", state_dir=tmp_path / "state"):
        yield llm


@pytest.fixture
def job_running(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Slurm says the serving job runs, on the node its entry names (`scontrol` on PATH)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    scontrol = bin_dir / "scontrol"
    scontrol.write_text(
        f"#!/bin/sh\necho 'JobId={JOB} JobState=RUNNING BatchHost={NODE} Restarts=0'\n"
    )
    scontrol.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


def test_the_summary_and_run_config_name_the_served_model_that_answered(
    campaign: CampaignProject, served_model: HttpService, job_running: None
) -> None:
    campaign.arm("demo", ARM)
    campaign.simple_scripts("s1")
    campaign.write("test_conversations.py", CONVERSATION_MODULE)
    arm = load_experiments(campaign.experiments).arms["demo"]
    assert served_model.port is not None
    entry = CatalogueEntry(
        name="shared",
        host="127.0.0.1",
        port=served_model.port,
        served_name="shared-model",
        identity=ServedIdentity(
            model=model_identity(arm, profile=Profile.LOCAL),
            vllm=arm.vllm.model_dump(mode="json"),
        ),
        job=EntryJob(id=JOB, node=NODE, restart_count=0),
        owner=EntryOwner(uid=os.geteuid(), name="me"),
        arm="demo",
        registered_at=now_utc(),
        key_file=key_file_name("shared", JOB),
    )
    # Without $CLUSTER_WORK the catalogue is <rootdir>/catalogue.
    register(campaign.root / "catalogue", entry, KEY, file_mode=0o640, key_group=None)
    result = campaign.run_subprocess()
    assert result.ret == 0, result.stdout.str()
    url = f"http://127.0.0.1:{served_model.port}/v1"
    result.stdout.fnmatch_lines(
        [
            "demo: 1 item(s) in * s (stack included): 1 completed",
            f"  model:       the served model 'shared' (job {JOB} on {NODE}, {url})",
        ],
        consecutive=False,
    )
    (run,) = (campaign.arm_dir("demo") / "runs").iterdir()
    config = (run / "run-config.env").read_text().splitlines()
    for line in (
        "SERVED_MODEL=shared",
        f"SERVED_MODEL_JOB={JOB}",
        f"SERVED_MODEL_NODE={NODE}",
        "SERVED_MODEL_ARM=demo",
        f"SERVED_MODEL_URL={url}",
    ):
        assert line in config, config
    for path in campaign.arm_dir("demo").rglob("*"):
        if path.is_file():
            assert KEY.encode() not in path.read_bytes(), path
