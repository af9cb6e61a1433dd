"""The model server's own account of itself, for run-config: what served the run (vLLM or a
stand-in) and its version, its models and cache configuration, its metrics, and the
arguments vLLM says it started with.

Keys: ``MODEL_SERVER`` is ``vllm``, ``standin`` or ``unknown`` (``GET /version`` did not
answer); ``MODEL_SERVER_VERSION`` is the version that server reports of itself (vLLM's
release; a stand-in's pytest-haico version). ``VLLM_VERSION`` is set only when vLLM served
the run; a stand-in's ``STANDIN_VLLM_VERSION`` is the vLLM release whose wire it imitates.
``VLLM_NON_DEFAULT_ARGS`` is vLLM's start-up line ``non-default args: {...}`` as it logged it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import httpx

from pytest_haico import httpclient

# The vLLM metrics a run keeps (requests still running at the end were abandoned but
# still generating).
METRICS = (
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:num_preemptions_total",
    "vllm:gpu_cache_usage_perc",
    "vllm:kv_cache_usage_perc",
)
CACHE_CONFIG_METRIC = "vllm:cache_config_info"
# How the stand-in's GET /version says it is one (`pytest_haico.standins.llm` answers it;
# the stand-ins and the core import nothing of each other).
STANDIN_VERSION_FIELD = "haico_standin"
NON_DEFAULT_ARGS = "non-default args: "
# vLLM logs its arguments among its first lines; a kept stack's log may have grown for days.
_STARTUP_LOG_BYTES = 1 << 20


def model_server_values(
    base_url: str, api_key: str, *, timeout: float = 5.0
) -> tuple[dict[str, str], dict[str, Any]]:
    """From the model server: what it is and its version (GET /version), its models (GET
    /v1/models) and vLLM's cache configuration (one GET /metrics)."""
    details: dict[str, Any] = {}
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    with httpclient.client(base_url=base_url, headers=headers, timeout=timeout) as c:
        values = server_identity(_get_json(c, "/version"))
        models = _get_json(c, "/v1/models")
        data = models.get("data", []) if models else []
        details["models"] = [
            {key: m.get(key) for key in ("id", "root", "max_model_len")}
            for m in data
            if isinstance(m, dict)
        ]
        cache_config = _metric_labels(_get_text(c, "/metrics"), CACHE_CONFIG_METRIC)
        if cache_config is not None:
            details["cache_config"] = cache_config
    return values, details


def server_identity(version: dict[str, Any] | None) -> dict[str, str]:
    """MODEL_SERVER, MODEL_SERVER_VERSION and VLLM_VERSION or STANDIN_VLLM_VERSION from the
    body of GET /version (None: it did not answer)."""
    if version is None or "version" not in version:
        return {"MODEL_SERVER": "unknown", "MODEL_SERVER_VERSION": "unknown"}
    release = str(version["version"])
    if STANDIN_VERSION_FIELD in version:
        return {
            "MODEL_SERVER": "standin",
            "MODEL_SERVER_VERSION": str(version[STANDIN_VERSION_FIELD]),
            "STANDIN_VLLM_VERSION": release,
        }
    return {"MODEL_SERVER": "vllm", "MODEL_SERVER_VERSION": release, "VLLM_VERSION": release}


def model_server_metrics(base_url: str, *, timeout: float = 5.0) -> dict[str, float]:
    """The vLLM metrics of `METRICS` from GET /metrics (Prometheus text), summed over labels."""
    try:
        response = httpclient.get(f"{base_url}/metrics", timeout=timeout)
    except httpx.HTTPError:
        return {}
    if response.status_code != 200:
        return {}
    return parse_metrics(response.text.splitlines())


def parse_metrics(lines: Iterable[str]) -> dict[str, float]:
    """`METRICS` from Prometheus text lines, each summed over its labels."""
    found: dict[str, float] = {}
    for line in lines:
        if not line or line.startswith("#"):
            continue
        name_and_labels, _, rest = line.partition(" ")
        name = name_and_labels.split("{", 1)[0]
        if name not in METRICS:
            continue
        try:
            value = float(rest.split()[0])
        except (ValueError, IndexError):
            continue
        found[name] = found.get(name, 0.0) + value
    return found


def startup_values(log_path: Path | None) -> tuple[dict[str, str], dict[str, Any]]:
    """vLLM's ``non-default args`` line from its log (the last in the log's first MiB):
    the text in ``VLLM_NON_DEFAULT_ARGS``, the dict it shows (a Python literal) in the
    details when it reads as one. Nothing for a server that logged none (or no log)."""
    if log_path is None:
        return {}, {}
    try:
        with log_path.open("rb") as log:
            head = log.read(_STARTUP_LOG_BYTES).decode("utf-8", "replace")
    except OSError:
        return {}, {}
    lines = [line for line in head.splitlines() if NON_DEFAULT_ARGS in line]
    if not lines:
        return {}, {}
    text = lines[-1].split(NON_DEFAULT_ARGS, 1)[1].strip()
    try:
        parsed = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        parsed = None
    details = {"vllm_non_default_args": parsed} if isinstance(parsed, dict) else {}
    return {"VLLM_NON_DEFAULT_ARGS": text}, details


def _metric_labels(text: str | None, name: str) -> dict[str, str] | None:
    """The labels of the first sample of metric `name` (an ``*_info`` metric's are its
    values)."""
    for line in (text or "").splitlines():
        if not line.startswith(name + "{"):
            continue
        inside = line[len(name) + 1 : line.rfind("}")]
        labels: dict[str, str] = {}
        for pair in inside.split('",'):
            key, _, value = pair.partition("=")
            if key:
                labels[key.strip()] = value.strip().strip('"')
        return labels
    return None


def _get_json(client: httpx.Client, path: str) -> dict[str, Any] | None:
    try:
        response = client.get(path)
        body = response.json() if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None
    return body if isinstance(body, dict) else None


def _get_text(client: httpx.Client, path: str) -> str | None:
    try:
        response = client.get(path)
    except httpx.HTTPError:
        return None
    return response.text if response.status_code == 200 else None
