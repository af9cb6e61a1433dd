"""The backend's small parts: the vllm host rule, ``*.localhost`` names, the rate limiter."""

from __future__ import annotations

import httpx
import pytest

from pytest_haico.standins.model_client import LoopbackTransport, endpoint_refusal
from pytest_haico.standins.rate_limit import SlidingWindowLimiter
from tests.standins.standin_procs import LlmServers


@pytest.mark.parametrize(
    "url",
    ["http://vllm.localhost:8000/v1", "http://my-vllm-node:8000/v1", "https://vllm.example.org/v1"],
)
def test_endpoints_on_a_vllm_host_are_accepted(url: str) -> None:
    assert endpoint_refusal(url) is None


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://localhost:8000/v1", "must contain 'vllm'"),
        ("http://api.openai.com/v1/vllm", "must contain 'vllm'"),
        ("ftp://vllm.localhost/v1", "must be an http or https URL"),
    ],
)
def test_endpoints_elsewhere_are_refused_naming_the_rule(url: str, reason: str) -> None:
    refusal = endpoint_refusal(url)
    assert refusal is not None
    assert reason in refusal


@pytest.mark.asyncio
async def test_localhost_names_reach_loopback_keeping_their_host_header(
    llm_server: LlmServers,
) -> None:
    port = llm_server().process.port
    seen: list[str] = []

    async def record(request: httpx.Request) -> None:
        seen.append(request.headers["host"])

    async with httpx.AsyncClient(
        transport=LoopbackTransport(), trust_env=False, event_hooks={"request": [record]}
    ) as client:
        for host in ("vllm.localhost", "a.b.localhost", "localhost"):
            response = await client.get(f"http://{host}:{port}/health")
            assert response.status_code == 200
            assert str(response.request.url.host) == "127.0.0.1"
    assert seen == [f"vllm.localhost:{port}", f"a.b.localhost:{port}", f"localhost:{port}"]


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_limiter_admits_n_per_sliding_minute() -> None:
    clock = FakeClock()
    limiter = SlidingWindowLimiter(2, clock=clock)
    assert limiter.admit() is None
    clock.now += 20
    assert limiter.admit() is None
    assert limiter.admit() == 40  # the first admission leaves the window in 40 s
    clock.now += 40
    assert limiter.admit() is None, "the first admission has left the window"
    assert limiter.admit() == 20
