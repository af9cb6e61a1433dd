"""The served model's identity against an arm's: each difference named, none for the same."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pytest_haico.config.experiment import Arm
from pytest_haico.config.identity import model_identity
from pytest_haico.config.settings import Profile
from pytest_haico.runner.served import backend_endpoint, identity_differences
from pytest_haico.serve.catalogue import (
    CatalogueEntry,
    EntryJob,
    EntryOwner,
    ServedIdentity,
    key_file_name,
    now_utc,
)
from pytest_haico.serve.resolver import ServedModel


def _arm(name: str, **sections: dict[str, Any]) -> Arm:
    return Arm.model_validate({"name": name, **sections})


def _served(arm: Arm, *, model: str | None = None, served_name: str | None = None) -> ServedModel:
    identity = ServedIdentity(
        model=model or model_identity(arm, profile=Profile.LOCAL),
        vllm=arm.vllm.model_dump(mode="json"),
        vllm_version="0.13.0",
    )
    entry = CatalogueEntry(
        name="judge",
        host="127.0.0.1",
        port=8011,
        served_name=served_name or arm.served_name,
        identity=identity,
        job=EntryJob(id="41", node="vm", restart_count=0),
        owner=EntryOwner(uid=0, name="root"),
        arm=arm.name,
        registered_at=now_utc(),
        key_file=key_file_name("judge", "41"),
    )
    return ServedModel(
        name="judge",
        endpoint=entry.endpoint,
        served_name=entry.served_name,
        identity=identity,
        key_file=Path("/nowhere") / entry.key_file,
        entry=entry,
    )


def test_the_arms_own_model_served_has_no_difference() -> None:
    arm = _arm("judge", model={"served": "judge"})
    assert identity_differences(arm, _served(arm), profile=Profile.LOCAL) == []


def test_another_configuration_names_each_difference() -> None:
    served = _served(_arm("judge", vllm={"max_model_len": 8192}, standin={"seed": 1}))
    arm = _arm("judge", vllm={"max_model_len": 4096}, model={"served": "judge"})
    assert identity_differences(arm, served, profile=Profile.LOCAL) == [
        "model.seed: served 1, the arm's 0",
        "vllm.max_model_len: served 8192, the arm's 4096",
    ]


def test_another_revision_and_served_name_are_named() -> None:
    arm = _arm("q", model={"hf_id": "Qwen/Q", "revision": "abc", "served": "q"})
    served = _served(arm, model="hf:Qwen/Q@def", served_name="other")
    assert identity_differences(arm, served, profile=Profile.CLUSTER) == [
        "served name 'other', the arm's 'q'",
        "model.revision: served 'def', the arm's 'abc'",
    ]


def test_a_backend_reaches_a_model_on_its_node_on_loopback_and_one_elsewhere_by_relay() -> None:
    """The backend sends VLLM_API_KEY only to a host named `vllm`: a model on another node
    is relayed (the stack's relay listens on loopback under vllm.localhost)."""
    entry = _served(_arm("judge")).entry.model_copy(update={"host": "node1"})
    here = backend_endpoint(entry, "sk-k", here={"node1", "node1.cluster"})
    assert (here.url, here.api_key, here.relayed) == (
        "http://vllm.localhost:8011/v1",
        "sk-k",
        False,
    )
    elsewhere = backend_endpoint(entry, "sk-k", here={"node2"})
    assert (elsewhere.url, elsewhere.relayed, elsewhere.host_port) == (
        "http://node1:8011/v1",
        True,
        ("node1", 8011),
    )
