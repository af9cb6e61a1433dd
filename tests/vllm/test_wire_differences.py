"""Where the stand-in and real vLLM 0.32 do not answer alike, on purpose: each difference with its
reason, asserted on both servers as the difference it is, so that drift on either side fails here.

Not compared at all (a CPU build and a 135M model cannot show them; the stand-in's personas and
its own tests keep them): GPU memory and tensor parallelism, a model that calls tools when it
should, and the scripted failures (personas flaky, dead, hang, slow, looper, bad_args, blank).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from pytest_haico import __version__
from pytest_haico.provenance.model_server import STANDIN_VERSION_FIELD
from tests.standins.standin_http import WRITE_DOCUMENT_TOOL
from tests.vllm.servers import ServerPair, iter_samples
from tests.vllm.test_wire_contract import HELLO, WEATHER, WEATHER_TOOL

# Fields vLLM 0.32 sends that no client of ours reads (almost all null); the stand-in omits them.
VLLM_ONLY_COMPLETION_FIELDS = frozenset(
    {
        "service_tier",
        "system_fingerprint",
        "prompt_logprobs",
        "prompt_token_ids",
        "prompt_text",
        "kv_transfer_params",
        "ec_transfer_params",
        "metrics",
        "choices.stop_reason",
        "choices.token_ids",
        "choices.routed_experts",
        "choices.message.refusal",
        "choices.message.annotations",
        "choices.message.audio",
        "choices.message.function_call",
        "choices.message.reasoning",
        "usage.prompt_tokens_details",
        "usage.completion_tokens_details",
    }
)
VLLM_ONLY_CHUNK_FIELDS = frozenset(
    {
        "prompt_token_ids",
        "prompt_text",
        "system_fingerprint",
        "choices.stop_reason",
        "choices.token_ids",
    }
)


@dataclass(frozen=True)
class Difference:
    """What differs, why, and what each server answers to `observe`."""

    reason: str
    observe: Callable[[ServerPair], object]
    standin: object
    vllm: object


def field_paths(value: Any, prefix: str = "") -> set[str]:
    """Dotted paths of every key in a JSON value (a list's items share its path)."""
    if isinstance(value, list):
        return set().union(*(field_paths(item, prefix) for item in value))
    if not isinstance(value, dict):
        return set()
    paths = set()
    for key, item in value.items():
        path = f"{prefix}{key}"
        paths |= {path} | field_paths(item, f"{path}.")
    return paths


def _reply(servers: ServerPair, messages: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
    response = servers.tools.chat(messages, temperature=0, **fields)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def _text_is_canned(servers: ServerPair) -> bool:
    content = _reply(servers, HELLO, max_tokens=64)["choices"][0]["message"]["content"]
    # A persona's answer quotes the user's words as its topic.
    return '"Say hello."' in content


def _prompt_tokens_of_hello(servers: ServerPair) -> bool:
    # The stand-in's count: 3 for the message, one per 4 characters of "Say hello.".
    return bool(_reply(servers, HELLO, max_tokens=1)["usage"]["prompt_tokens"] == 3 + 3)


def _loose_forced_call_conforms(servers: ServerPair) -> bool:
    function = {k: v for k, v in WEATHER_TOOL["function"].items() if k != "strict"}
    loose = {"type": "function", "function": function}
    named = {"type": "function", "function": {"name": "get_weather"}}
    body = _reply(servers, WEATHER, tools=[loose], tool_choice=named, max_tokens=256)
    (call,) = body["choices"][0]["message"]["tool_calls"]
    arguments = json.loads(call["function"]["arguments"])
    return isinstance(arguments, dict) and isinstance(arguments.get("city"), str)


def _calls_the_tool_when_asked_for_a_document(servers: ServerPair) -> bool:
    ask = [{"role": "user", "content": "Please write a document about Crete in May."}]
    body = _reply(servers, ask, tools=[WRITE_DOCUMENT_TOOL], max_tokens=48)
    return bool(body["choices"][0]["message"].get("tool_calls"))


def _vllm_only_completion_fields(servers: ServerPair) -> frozenset[str]:
    paths = field_paths(_reply(servers, HELLO, max_tokens=4))
    return VLLM_ONLY_COMPLETION_FIELDS & paths


def _vllm_only_chunk_fields(servers: ServerPair) -> frozenset[str]:
    chunks = servers.tools.stream(
        HELLO, max_tokens=4, temperature=0, stream_options={"include_usage": True}
    )
    return VLLM_ONLY_CHUNK_FIELDS & field_paths(chunks)


def _id_suffix_lengths(servers: ServerPair) -> tuple[int, int]:
    body = _reply(servers, WEATHER, tools=[WEATHER_TOOL], tool_choice="required", max_tokens=256)
    (call,) = body["choices"][0]["message"]["tool_calls"]
    return len(body["id"].removeprefix("chatcmpl-")), len(call["id"].removeprefix("chatcmpl-tool-"))


def _says_it_is_a_standin(servers: ServerPair) -> object:
    return servers.tools.get("/version", key="").json().get(STANDIN_VERSION_FIELD)


def _metrics_exposition(servers: ServerPair) -> tuple[str, bool]:
    response = servers.tools.get("/metrics", key="")
    names = {name for name, _ in iter_samples(response.text)}
    return response.headers["content-type"], "vllm:num_requests_waiting_by_reason" in names


def _finished_reasons(servers: ServerPair) -> frozenset[str]:
    text = servers.tools.get("/metrics", key="").text
    return frozenset(
        labels["finished_reason"]
        for name, labels in iter_samples(text)
        if name == "vllm:request_success_total"
    )


def _block_size(servers: ServerPair) -> str:
    text = servers.tools.get("/metrics", key="").text
    (labels,) = (labels for name, labels in iter_samples(text) if name == "vllm:cache_config_info")
    return labels["block_size"]


DIFFERENCES: dict[str, Difference] = {
    "canned-text": Difference(
        "the stand-in answers with a persona's text chosen by hash(seed, messages), so that a "
        "replay is identical; vLLM generates",
        _text_is_canned,
        standin=True,
        vllm=False,
    ),
    "token-counts": Difference(
        "the stand-in counts one token per 4 characters plus 3 a message; vLLM counts with the "
        "model's tokenizer and chat template (which adds a system prompt)",
        _prompt_tokens_of_hello,
        standin=True,
        vllm=False,
    ),
    "loose-forced-call": Difference(
        "vLLM 0.32 pins a forced call's arguments to the schema only for `strict: true` tools "
        "(--tool-strict-level auto); the stand-in's forced calls always conform",
        _loose_forced_call_conforms,
        standin=True,
        vllm=False,
    ),
    "auto-tool-call": Difference(
        "persona helpful calls the artifact tool when a turn asks for a document; a 135M model "
        "cannot call tools on purpose and answers in text",
        _calls_the_tool_when_asked_for_a_document,
        standin=True,
        vllm=False,
    ),
    "unread-completion-fields": Difference(
        "vLLM sends fields no client of ours reads (nulls, its system_fingerprint); the "
        "stand-in leaves them out",
        _vllm_only_completion_fields,
        standin=frozenset(),
        vllm=VLLM_ONLY_COMPLETION_FIELDS,
    ),
    "unread-chunk-fields": Difference(
        "the same for stream chunks",
        _vllm_only_chunk_fields,
        standin=frozenset(),
        vllm=VLLM_ONLY_CHUNK_FIELDS,
    ),
    "id-lengths": Difference(
        "the stand-in's ids are longer: a completion's a uuid4, a call's derived from the "
        "request so that replays send identical histories; clients only read the prefixes",
        _id_suffix_lengths,
        standin=(32, 24),
        vllm=(16, 16),
    ),
    "version-names-the-standin": Difference(
        "the stand-in's GET /version also says it is one (with pytest-haico's version), so that "
        "a run it served never records that a vLLM did; vLLM answers its release only",
        _says_it_is_a_standin,
        standin=__version__,
        vllm=None,
    ),
    "metrics-exposition": Difference(
        "vLLM's prometheus_client writes exposition format 1.0.0 and dozens of families; the "
        "stand-in writes 0.0.4 (the same sample lines) and only the families the harness reads",
        _metrics_exposition,
        standin=("text/plain; version=0.0.4; charset=utf-8", False),
        vllm=("text/plain; version=1.0.0; charset=utf-8", True),
    ),
    "finished-reasons": Difference(
        "vLLM 0.32 also counts requests finished by error and repetition; the stand-in has neither",
        _finished_reasons,
        standin=frozenset({"stop", "length", "abort"}),
        vllm=frozenset({"stop", "length", "abort", "error", "repetition"}),
    ),
    "kv-block-size": Difference(
        "the stand-in imitates vLLM on a GPU (16-token KV blocks); vLLM for CPUs uses 128",
        _block_size,
        standin="16",
        vllm="128",
    ),
}


@pytest.mark.parametrize("name", DIFFERENCES)
def test_a_listed_difference_is_still_the_difference_it_is(servers: ServerPair, name: str) -> None:
    difference = DIFFERENCES[name]
    expected = difference.standin if servers.kind == "standin" else difference.vllm
    assert difference.observe(servers) == expected, difference.reason
