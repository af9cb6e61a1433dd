"""The model relay: a model server the backend could not name with `vllm` (another node's
`http://gpu07:8011/v1`, `--haico-model-endpoint http://127.0.0.1:PORT/v1`) is reached
through a relay on loopback, which carries requests, streamed answers and the key untouched."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from pytest_haico.stack import ModelEndpoint, Orchestrator
from pytest_haico.stack.local import build_llm_service
from pytest_haico.stack.profiles import HttpService
from pytest_haico.stack.relay import RELAY, build_relay_service

KEY = "the-model-key"


@pytest.mark.parametrize(
    ("url", "relayed"),
    [
        ("http://gpu07:8011/v1", True),
        ("http://127.0.0.1:8011/v1", True),
        ("http://vllm.localhost:8011/v1", False),
        ("https://vllm-judge.example.org/v1", False),
        # TLS through the relay would name the wrong host: the static gate refuses it.
        ("https://models.example.org/v1", False),
    ],
)
def test_an_endpoint_whose_host_does_not_say_vllm_is_relayed(url: str, relayed: bool) -> None:
    assert ModelEndpoint(url, KEY).relayed is relayed


def test_the_relay_runs_by_path_isolated_from_the_environment() -> None:
    relay = build_relay_service("gpu07", 8011)
    argv = list(relay.argv(20001))
    assert argv[1:3] == ["-I", str(Path(__file__).parents[2] / "pytest_haico/stack/relay.py")]
    assert argv[3:] == ["20001", "gpu07", "8011"]


@pytest.fixture
def relayed_model(tmp_path: Path) -> Iterator[tuple[HttpService, HttpService]]:
    """A stand-in model server and a relay to it, started by the stack's orchestrator."""
    llm = build_llm_service(
        served_name="shared-model",
        max_model_len=8192,
        tool_call_parser="hermes",
        persona="helpful",
        latency_ms=0,
        seed=0,
        api_key=KEY,
    )
    # The relay's target is the model's port, known once the model is healthy.
    with Orchestrator([llm], tmp_path / "llm-logs", state_dir=tmp_path / "state"):
        assert llm.port is not None
        relay = build_relay_service("127.0.0.1", llm.port)
        with Orchestrator([relay], tmp_path / "relay-logs", state_dir=tmp_path / "state"):
            yield llm, relay


def _streamed_text(base: str, key: str) -> tuple[str, int]:
    """The content of a streamed chat answer, and the number of chunks it came in."""
    body = {
        "model": "shared-model",
        "messages": [{"role": "user", "content": "Plan a trip to Lisbon"}],
        "stream": True,
    }
    text, chunks = "", 0
    headers = {"Authorization": f"Bearer {key}"}
    with httpx.stream("POST", f"{base}/v1/chat/completions", json=body, headers=headers) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks += 1
                for choice in json.loads(line.removeprefix("data: "))["choices"]:
                    text += choice["delta"].get("content") or ""
    return text, chunks


def test_the_relay_carries_a_streamed_answer_and_leaves_the_key_to_the_model(
    relayed_model: tuple[HttpService, HttpService],
) -> None:
    llm, relay = relayed_model
    assert relay.name == RELAY
    # The relay adds no key: without one, the model server itself refuses.
    assert httpx.get(f"{relay.url}/v1/models").status_code == 401
    models = httpx.get(f"{relay.url}/v1/models", headers={"Authorization": f"Bearer {KEY}"})
    assert [m["id"] for m in models.json()["data"]] == ["shared-model"]
    direct, direct_chunks = _streamed_text(llm.url, KEY)
    relayed, relayed_chunks = _streamed_text(relay.url, KEY)
    assert relayed == direct and relayed
    assert relayed_chunks == direct_chunks > 1
