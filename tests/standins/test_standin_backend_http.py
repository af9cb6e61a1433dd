"""The stand-in backend's HTTP surface: auth, refusals, rate limit, secrets, signals."""

from __future__ import annotations

import signal
import subprocess
import sys
import uuid

import httpx
import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from pytest_haico.standins.backend_app import CHECKPOINTER_APPLICATION_NAME
from tests.standins.standin_http import (
    ADMIN_TOKEN,
    API_KEY,
    MODEL,
    auth,
    get,
    post,
    post_query,
    run_turn,
)
from tests.standins.standin_procs import (
    BackendServer,
    BackendServers,
    LlmServers,
    base_env,
    free_port,
)

STOP_SIGNALS = [signal.SIGTERM, signal.SIGINT]


@pytest.fixture(scope="module", autouse=True)
def _servers(llm_server: LlmServers, backend_server: BackendServers) -> None:
    """Start this module's servers together, so their start-ups overlap."""
    llm_server.prefetch([("helpful", {}), ("hang", {}), ("helpful", {"api_key": "another-key"})])
    # Replicas of their own: these tests stop them.
    stoppable = [{"stop_signal": s, "replica": 1} for s in STOP_SIGNALS]
    broken = {"replica": 2}  # its checkpointer's connection is cut
    backend_server.prefetch([{}, {"rate_limit_rpm": 2}, broken, *stoppable])


@pytest.fixture
def backend(backend_server: BackendServers) -> BackendServer:
    return backend_server()


def query_body(endpoint_url: str, **fields: object) -> dict[str, object]:
    model = {"API": "openai", "model_id": MODEL, "endpoint_url": endpoint_url}
    return {
        "query": "hi",
        "thread_id": f"t-{uuid.uuid4().hex[:8]}",
        "config": {"model": model},
    } | fields


def unreachable_endpoint() -> str:
    return f"http://vllm.localhost:{free_port()}/v1"


@pytest.mark.parametrize(
    "headers",
    [{}, auth("wrong"), {"Authorization": ADMIN_TOKEN}, auth(API_KEY)],
    ids=["none", "wrong", "no-bearer", "model-key"],
)
def test_health_and_queries_need_the_admin_token(
    backend: BackendServer, headers: dict[str, str]
) -> None:
    health = get(backend.base_url + "/api/health", headers=headers)
    body = query_body(unreachable_endpoint())
    query = post(backend.base_url + "/api/query/stream_steps/sse", json=body, headers=headers)
    for response in (health, query):
        assert response.status_code == 401
        assert response.headers["www-authenticate"] == "Bearer"


def test_health_with_the_admin_token_is_ok(backend: BackendServer) -> None:
    response = get(backend.base_url + "/api/health", headers=auth(ADMIN_TOKEN))
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1", "api.openai.com"])
def test_an_endpoint_host_without_vllm_is_400(backend: BackendServer, host: str) -> None:
    response = post_query(backend.base_url, query_body(f"http://{host}:8000/v1"))
    assert response.status_code == 400
    assert f"endpoint_url host {host!r} must contain 'vllm'" in response.json()["detail"]


@pytest.mark.parametrize(
    "body",
    [{"query": "hi"}, query_body("http://vllm.localhost:1/v1", branch_from_turn=-1)],
    ids=["no-config", "negative-branch"],
)
def test_a_malformed_query_is_422(backend: BackendServer, body: dict[str, object]) -> None:
    assert post_query(backend.base_url, body).status_code == 422


def test_a_branch_without_a_thread_is_400(backend: BackendServer) -> None:
    body = query_body(unreachable_endpoint(), thread_id=None, branch_from_turn=0)
    response = post_query(backend.base_url, body)
    assert response.status_code == 400
    assert "branch_from_turn needs the thread_id" in response.json()["detail"]


def test_queries_past_the_rate_limit_are_429(backend_server: BackendServers) -> None:
    backend = backend_server(rate_limit_rpm=2)
    endpoint = unreachable_endpoint()  # the fastest turn: the limit counts queries, not outcomes
    for _ in range(2):
        assert run_turn(backend.base_url, "hi", endpoint, thread_id=None)[-1]["kind"] == "model"
    refused = post_query(backend.base_url, query_body(endpoint))
    assert refused.status_code == 429
    assert 1 <= int(refused.headers["retry-after"]) <= 60
    assert refused.json()["detail"] == "rate limit of 2 queries per minute"
    assert get(backend.base_url + "/api/health", headers=auth(ADMIN_TOKEN)).status_code == 200


def test_a_client_leaving_a_hanging_turn_leaves_the_backend_serving(
    backend: BackendServer, llm_server: LlmServers
) -> None:
    # The model answers the turn's first request with a tool call, then hangs on the next.
    body = query_body(llm_server("hang").endpoint_url, query="Write a report.")
    with pytest.raises(httpx.ReadTimeout):
        post(
            backend.base_url + "/api/query/stream_steps/sse",
            json=body,
            headers=auth(ADMIN_TOKEN),
            timeout=httpx.Timeout(10.0, read=0.5),
        )
    events = run_turn(backend.base_url, "hi", llm_server("helpful").endpoint_url, thread_id=None)
    assert events[-1]["type"] == "complete"


def test_a_lost_checkpointer_connection_fails_turns_and_health(
    backend_server: BackendServers, llm_server: LlmServers
) -> None:
    backend = backend_server(replica=2)  # of its own: it stays broken
    endpoint = llm_server("helpful").endpoint_url
    assert run_turn(backend.base_url, "hi", endpoint, thread_id=None)[-1]["type"] == "complete"
    with psycopg.connect(backend.database_dsn, autocommit=True) as conn:
        ended = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND application_name = %s",
            (CHECKPOINTER_APPLICATION_NAME,),
        ).fetchall()
    assert ended == [(True,)]
    failed = run_turn(backend.base_url, "hi", endpoint, thread_id=None)[-1]
    assert (failed["type"], failed["kind"]) == ("error", "internal")
    health = get(backend.base_url + "/api/health", headers=auth(ADMIN_TOKEN))
    assert health.status_code == 503
    assert health.json()["detail"] == "the checkpointer's database connection was lost"


def test_no_secret_reaches_the_log(backend: BackendServer, llm_server: LlmServers) -> None:
    wrong_key = llm_server("helpful", api_key="another-key").endpoint_url
    assert run_turn(backend.base_url, "hi", wrong_key, thread_id=None)[-1]["kind"] == "auth"
    run_turn(
        backend.base_url, "Write a report.", llm_server("helpful").endpoint_url, thread_id=None
    )
    get(backend.base_url + "/api/health", headers=auth("wrong"))
    log = backend.process.log_path.read_text()
    assert "turn 0 of thread" in log
    password = str(conninfo_to_dict(backend.database_dsn)["password"])
    for secret in (ADMIN_TOKEN, API_KEY, password):
        assert secret not in log


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"HAICO_DATABASE_URL": "host=127.0.0.1"}, "$ADMIN_DEFAULT_API_TOKEN is not set"),
        ({"ADMIN_DEFAULT_API_TOKEN": "t"}, "$HAICO_DATABASE_URL is not set"),
    ],
    ids=["admin-token", "database-url"],
)
def test_a_missing_secret_stops_the_start_with_exit_2(env: dict[str, str], message: str) -> None:
    argv = [sys.executable, "-m", "pytest_haico.standins.backend", "--port", "1"]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=base_env() | env)
    assert result.returncode == 2
    assert message in result.stderr


@pytest.mark.parametrize("sig", STOP_SIGNALS, ids=["TERM", "INT"])
def test_a_signal_stops_the_backend_with_exit_0(
    backend_server: BackendServers, sig: signal.Signals
) -> None:
    backend = backend_server(stop_signal=sig, replica=1)
    assert backend.stop() == 0
    assert "Application shutdown complete" in backend.process.log_path.read_text()
