"""The harness's HTTP clients: no proxy or credentials from the environment, and one TLS
context for all of them.

httpx loads the CA bundle for each client it makes, about 30 ms of CPU; a stack's start makes
several on the way to the first item (each service's health probe, the gates' canary, the
conversations' client, provenance's questions to the model server). A cluster's proxy
settings must never capture loopback traffic, nor a .netrc add credentials.
"""

from __future__ import annotations

import functools
import ssl
from typing import Any

import httpx


@functools.cache
def tls_context() -> ssl.SSLContext:
    """The CA bundle as a client with ``trust_env=False`` loads it, loaded once (a context
    may be shared between clients and threads)."""
    return httpx.create_ssl_context(trust_env=False)


def client(**options: Any) -> httpx.Client:
    """An `httpx.Client` with *options*, these settings and the shared TLS context."""
    return httpx.Client(trust_env=False, verify=tls_context(), **options)


def async_client(**options: Any) -> httpx.AsyncClient:
    """An `httpx.AsyncClient` with *options*, these settings and the shared TLS context."""
    return httpx.AsyncClient(trust_env=False, verify=tls_context(), **options)


def get(url: str, *, headers: dict[str, str] | None = None, timeout: float) -> httpx.Response:
    """One GET, as `httpx.get` with these settings; raises `httpx.HTTPError` as it does."""
    with client(timeout=timeout) as session:
        return session.get(url, headers=headers)
