"""What the stand-in vLLM reports about itself: ``/version`` and ``/metrics``."""

from __future__ import annotations

import json
import re
from http.client import HTTPConnection
from typing import Any

import httpx
import pytest

from pytest_haico import __version__
from pytest_haico.provenance.model_server import server_identity
from pytest_haico.standins.vllm_versions import DEFAULT_VLLM_VERSION
from tests.polling import wait_for
from tests.standins.standin_http import MODEL, TOOLS, auth, chat, continued, get, user
from tests.standins.standin_procs import LlmServers

_SAMPLE = re.compile(r"(?P<name>[a-z_:]+)\{(?P<labels>[^}]*)\} (?P<value>\S+)")
_LABEL = re.compile(r'(\w+)="([^"]*)"')


def read_metrics(base_url: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """``/metrics`` as {(name, labels): value}, asserting the text format's shape."""
    response = get(base_url + "/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    samples = {}
    for line in response.text.splitlines():
        if line.startswith("#"):
            assert re.fullmatch(r"# (HELP|TYPE) vllm:\w+ .+", line), line
            continue
        match = _SAMPLE.fullmatch(line)
        assert match is not None, line
        labels = frozenset(_LABEL.findall(match["labels"]))
        samples[match["name"], labels] = float(match["value"])
    return samples


def engine_value(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str) -> float:
    """The value of an engine-0 series of the stand-in's model."""
    return samples[name, frozenset({("engine", "0"), ("model_name", MODEL)})]


def test_version_reports_the_imitated_release_and_that_it_is_a_stand_in(
    llm_server: LlmServers,
) -> None:
    standin = {"haico_standin": __version__}
    answer = get(llm_server().base_url + "/version").json()
    assert answer == {"version": DEFAULT_VLLM_VERSION, **standin}
    other = llm_server(vllm_version="0.8.5.post1").base_url
    assert get(other + "/version").json() == {"version": "0.8.5.post1", **standin}
    # What run-config makes of it: no vLLM served the run.
    assert server_identity(answer) == {
        "MODEL_SERVER": "standin",
        "MODEL_SERVER_VERSION": __version__,
        "STANDIN_VLLM_VERSION": DEFAULT_VLLM_VERSION,
    }


def test_metrics_count_the_tokens_of_the_completions(llm_server: LlmServers) -> None:
    base_url = llm_server(replica=10).base_url  # its own: every request here is counted
    before = read_metrics(base_url)
    assert engine_value(before, "vllm:prompt_tokens_total") == 0
    assert engine_value(before, "vllm:generation_tokens_total") == 0
    usages = [
        chat(base_url, user("hello there")).json()["usage"],
        chat(base_url, user("write a report on Crete"), tools=TOOLS).json()["usage"],
        chat(base_url, user("tell me about Crete " * 5), max_tokens=3).json()["usage"],
    ]
    assert chat(base_url, user("hi"), model="other").status_code == 404  # never reaches it
    after = read_metrics(base_url)
    prompt = sum(u["prompt_tokens"] for u in usages)
    generated = sum(u["completion_tokens"] for u in usages)
    assert engine_value(after, "vllm:prompt_tokens_total") == prompt
    assert engine_value(after, "vllm:generation_tokens_total") == generated
    assert engine_value(after, "vllm:num_preemptions_total") == 0
    assert engine_value(after, "vllm:num_requests_running") == 0
    assert engine_value(after, "vllm:num_requests_waiting") == 0
    assert engine_value(after, "vllm:kv_cache_usage_perc") == 0
    success = {
        dict(labels)["finished_reason"]: value
        for (name, labels), value in after.items()
        if name == "vllm:request_success_total"
    }
    # A tool call finishes "stop" in the engine; "tool_calls" is only the API's word.
    assert success == {"stop": 2, "length": 1, "abort": 0}
    (info,) = [labels for name, labels in after if name == "vllm:cache_config_info"]
    assert ("block_size", "16") in info


def send_without_reading(base_url: str, messages: list[dict[str, Any]]) -> HTTPConnection:
    """Send a chat completion and leave it pending; closing the connection abandons it."""
    url = httpx.URL(base_url)
    assert url.port is not None
    connection = HTTPConnection(url.host, url.port, timeout=30)
    body = json.dumps({"model": MODEL, "messages": messages})
    headers = {**auth(), "Content-Type": "application/json"}
    connection.request("POST", "/v1/chat/completions", body=body, headers=headers)
    return connection


def running_and_waiting(base_url: str) -> tuple[float, float]:
    samples = read_metrics(base_url)
    return (
        engine_value(samples, "vllm:num_requests_running"),
        engine_value(samples, "vllm:num_requests_waiting"),
    )


def test_metrics_show_running_and_waiting_requests_and_cache_usage(
    llm_server: LlmServers,
) -> None:
    base_url = llm_server("hang", max_num_seqs=1).base_url
    # Conversations that go on: persona hang holds them.
    pending = [send_without_reading(base_url, continued("hi " * 100)) for _ in range(2)]
    try:
        wait_for(
            lambda: running_and_waiting(base_url) == (1, 1),
            timeout=10,
            what="one request running and one waiting",
        )
        samples = read_metrics(base_url)
        assert 0 < engine_value(samples, "vllm:kv_cache_usage_perc") < 1
        assert engine_value(samples, "vllm:prompt_tokens_total") > 0  # the running one's
    finally:
        for connection in pending:
            connection.close()  # abandoned: the hanging persona lets go of each in turn
    wait_for(
        lambda: running_and_waiting(base_url) == (0, 0),
        timeout=10,
        what="no request running or waiting",
    )
    assert engine_value(read_metrics(base_url), "vllm:kv_cache_usage_perc") == 0


@pytest.mark.parametrize(
    ("vllm_version", "gpu", "kv"),
    [("0.9.0", True, False), ("0.10.2", True, True), (None, False, True)],
    ids=["0.9.0", "0.10.2", "default"],
)
def test_the_cache_usage_metric_is_named_as_in_the_release(
    llm_server: LlmServers, vllm_version: str | None, gpu: bool, kv: bool
) -> None:
    names = {name for name, _ in read_metrics(llm_server(vllm_version=vllm_version).base_url)}
    assert ("vllm:gpu_cache_usage_perc" in names) is gpu
    assert ("vllm:kv_cache_usage_perc" in names) is kv
