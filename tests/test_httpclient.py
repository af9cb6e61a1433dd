"""The harness's HTTP clients: one TLS context for all, and nothing from the environment."""

from __future__ import annotations

import asyncio
import http.server
import threading
from collections.abc import Iterator

import httpx
import pytest

from pytest_haico import httpclient


class _EchoAuthorization(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = (self.headers.get("Authorization") or "none").encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def server_url() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _EchoAuthorization)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


def _tls_context(client: httpx.Client | httpx.AsyncClient) -> object:
    """The TLS context of *client*'s connection pool (httpx's and httpcore's internals)."""
    return client._transport._pool._ssl_context  # type: ignore[union-attr]


def test_every_client_shares_one_tls_context() -> None:
    with httpclient.client() as one, httpclient.client(timeout=1.0) as two:
        contexts = {id(_tls_context(one)), id(_tls_context(two))}
    assert contexts == {id(httpclient.tls_context())}
    asynchronous = httpclient.async_client()
    assert _tls_context(asynchronous) is httpclient.tls_context()
    asyncio.run(asynchronous.aclose())


def test_a_get_takes_no_proxy_or_credentials_from_the_environment(
    server_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory
) -> None:
    netrc = tmp_path_factory.mktemp("home") / ".netrc"
    netrc.write_text("machine 127.0.0.1 login someone password not-for-loopback\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc))
    for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.setenv(name, "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    assert httpclient.get(server_url, timeout=5.0).text == "none"
    answer = httpclient.get(server_url, headers={"Authorization": "Bearer t"}, timeout=5.0)
    assert answer.text == "Bearer t"
