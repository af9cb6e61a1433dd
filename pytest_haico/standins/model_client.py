"""The backend's model client: the vllm host rule, ``*.localhost`` names, and ChatOpenAI."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx
import openai
from langchain_openai import ChatOpenAI
from openai._base_client import make_request_options

from pytest_haico.standins.backend_wire import ModelConfig
from pytest_haico.standins.model_stream import LeanChatOpenAI

# With no key configured vLLM accepts anything; "EMPTY" is its documented placeholder. Never
# fall back to OPENAI_API_KEY: that would send a real provider key to a local server.
NO_KEY = "EMPTY"
# The model call has no deadline of its own beyond this; the driver's turn timeout is shorter.
MODEL_TIMEOUT = httpx.Timeout(600.0, connect=10.0)


def endpoint_refusal(endpoint_url: str) -> str | None:
    """Why the backend refuses *endpoint_url*, or None.

    The HAI-Co² backend picks the provider from the endpoint's host name: only a host that
    contains ``vllm`` gets ``VLLM_API_KEY``. The stand-in serves nothing else.
    """
    try:
        url = httpx.URL(endpoint_url)
    except httpx.InvalidURL as exc:
        return f"endpoint_url {endpoint_url!r} is not a URL: {exc}"
    if url.scheme not in ("http", "https"):
        return f"endpoint_url {endpoint_url!r} must be an http or https URL"
    if "vllm" not in url.host:
        return (
            f"endpoint_url host {url.host!r} must contain 'vllm': the backend sends "
            "VLLM_API_KEY only to vLLM endpoints (e.g. http://vllm.localhost:PORT/v1)"
        )
    return None


def provider_for(endpoint_url: str) -> str:
    """The provider the backend records for an endpoint (its snapshot's ``provider``)."""
    return "vllm" if "vllm" in httpx.URL(endpoint_url).host else "openai"


def _to_loopback(request: httpx.Request) -> None:
    host = request.url.host
    if host == "localhost" or host.endswith(".localhost"):
        request.url = request.url.copy_with(host="127.0.0.1")


class LoopbackTransport(httpx.AsyncHTTPTransport):
    """Sends requests for ``localhost`` and ``*.localhost`` to 127.0.0.1.

    RFC 6761 makes those names loopback, but Debian's resolver (``hosts: files dns``) does not
    resolve ``vllm.localhost``; mapping them here keeps /etc/hosts untouched. The Host header
    keeps the name the client asked for.
    """

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        _to_loopback(request)
        return await super().handle_async_request(request)


class SyncLoopbackTransport(httpx.HTTPTransport):
    """`LoopbackTransport` for the synchronous client."""

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        _to_loopback(request)
        return super().handle_request(request)


@dataclass(frozen=True)
class ModelHttpClients:
    """The HTTP clients every model call goes through, one of each kind, made at start-up.

    The backend calls models asynchronously only, but ChatOpenAI wants a synchronous client
    too: without one it builds its own per endpoint, honouring the environment's proxies,
    and loading the CA bundle for it takes about 0.1 s inside that endpoint's first turn.
    """

    sync: httpx.Client
    asynchronous: httpx.AsyncClient

    async def aclose(self) -> None:
        self.sync.close()
        await self.asynchronous.aclose()


def build_http_clients() -> ModelHttpClients:
    """The backend's model clients."""
    # trust_env=False: an HTTP(S)_PROXY inherited from a cluster shell must not capture
    # loopback traffic, and no .netrc credentials may be attached.
    # One TLS context for both: each loads the CA bundle, about 30 ms.
    tls = httpx.create_ssl_context()
    return ModelHttpClients(
        sync=httpx.Client(
            transport=SyncLoopbackTransport(verify=tls), trust_env=False, timeout=MODEL_TIMEOUT
        ),
        asynchronous=httpx.AsyncClient(
            transport=LoopbackTransport(verify=tls), trust_env=False, timeout=MODEL_TIMEOUT
        ),
    )


# Arguments of the SDK's ``create`` that are request options, not body fields.
_OPTION_ARGS = ("extra_headers", "extra_query", "extra_body", "timeout")


class LeanCompletions:
    """ChatOpenAI's ``async_client``: the SDK's ``chat.completions.create``, less two copies.

    ChatOpenAI hands ``create`` a body that is already plain JSON. The SDK walks it against
    its TypedDicts first, and builds a pydantic model of each streamed chunk that ChatOpenAI
    dumps straight back to a dict: together about a quarter of a one-call turn's CPU. This
    posts the body as given and yields the chunks as decoded, through the client's own
    ``post``: URL, headers, auth, timeouts and every error raised are still the SDK's.
    """

    def __init__(self, client: openai.AsyncOpenAI) -> None:
        self._client = client

    async def create(self, **body: Any) -> Any:
        """What ``chat.completions.create(**body)`` sends; chunks and replies as dicts."""
        options = make_request_options(
            **{name: body.pop(name) for name in _OPTION_ARGS if name in body},
            security={"bearer_auth": True},
        )
        return await self._client.post(
            "/chat/completions",
            body=body,
            cast_to=object,
            options=options,
            stream=bool(body.get("stream")),
            stream_cls=openai.AsyncStream[object],
        )


def build_chat_model(
    config: ModelConfig, *, api_key: str | None, http_clients: ModelHttpClients
) -> ChatOpenAI:
    """ChatOpenAI for one request's model config: streaming with usage, no retries, its
    asynchronous calls through `LeanCompletions` and its stream merged as it arrives."""
    model = LeanChatOpenAI(
        base_url=config.endpoint_url,
        model=config.model_id,
        api_key=api_key or NO_KEY,  # type: ignore[arg-type]  # str is accepted at runtime
        max_tokens=config.max_tokens,  # type: ignore[call-arg]  # alias of max_completion_tokens
        temperature=config.temperature,
        max_retries=0,
        streaming=True,
        stream_usage=True,
        http_client=http_clients.sync,
        http_async_client=http_clients.asynchronous,
        # Explicit: an OPENAI_PROXY in the environment would otherwise be refused next to a
        # custom client, or route loopback traffic through a proxy.
        openai_proxy=None,
    )
    model.async_client = LeanCompletions(model.root_async_client)
    return model
