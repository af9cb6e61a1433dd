"""Turns through the stand-in backend: recursion limits, artifacts, branches, model failures."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from pytest_haico.standins.agent import CANNED_REPLY
from tests.standins.standin_http import MODEL, post_query, run_turn
from tests.standins.standin_procs import BackendServer, BackendServers, LlmServers, free_port

# One backend for both flags (each test looks at what only its flag changes): one start-up less.
VARIANT: dict[str, object] = {"recursion_flag": False, "substitute_model": "other-model"}


@pytest.fixture(scope="module", autouse=True)
def _servers(llm_server: LlmServers, backend_server: BackendServers) -> None:
    """Start the model servers of this module together, and the default backend."""
    llm_server.prefetch([(p, {}) for p in ("helpful", "looper", "bad_args", "flaky")])
    backend_server.prefetch([{}, VARIANT])


@pytest.fixture
def backend(backend_server: BackendServers) -> BackendServer:
    return backend_server()


def new_thread() -> str:
    return f"thread-{uuid.uuid4().hex[:12]}"


def steps_of(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    assert all(e["type"] == "step" for e in events[:-1]), events
    return [e["step"] for e in events[:-1]]


@pytest.mark.parametrize("limit", [2, 4, 6])
def test_an_even_limit_ends_normally_on_the_canned_reply_and_is_flagged(
    backend: BackendServer, llm_server: LlmServers, limit: int
) -> None:
    thread = new_thread()
    events = run_turn(
        backend.base_url,
        "hi",
        llm_server("looper").endpoint_url,
        thread_id=thread,
        recursion_limit=limit,
    )
    steps = steps_of(events)
    assert steps[-1]["content"] == CANNED_REPLY
    assert steps[-1]["message_type"] == "ai"
    assert steps[-1]["tool_calls"] == []
    assert all(s["tool_calls"] for s in steps[:-1] if s["message_type"] == "ai")
    complete = events[-1]
    assert complete["type"] == "complete"
    assert complete["recursion_limit_reached"] is True
    assert complete["thread_id"] == thread
    assert complete["turn_index"] == 0
    assert complete["usage"]["tokens_in"] > 0
    assert complete["usage"]["tokens_out"] > 0


@pytest.mark.parametrize("limit", [1, 3, 5])
def test_an_odd_limit_is_an_error_of_kind_recursion_limit(
    backend: BackendServer, llm_server: LlmServers, limit: int
) -> None:
    thread = new_thread()
    events = run_turn(
        backend.base_url,
        "hi",
        llm_server("looper").endpoint_url,
        thread_id=thread,
        recursion_limit=limit,
    )
    error = events[-1]
    assert error["type"] == "error"
    assert error["kind"] == "recursion_limit"
    assert f"Recursion limit of {limit} reached" in error["error"]
    assert not any(e["type"] == "complete" for e in events)
    (row,) = backend.snapshots(thread)
    assert (row["outcome"], row["error_kind"]) == ("error", "recursion_limit")


def test_without_the_recursion_flag_the_canned_reply_is_left_to_the_client(
    backend_server: BackendServers, llm_server: LlmServers
) -> None:
    backend = backend_server(**VARIANT)
    events = run_turn(
        backend.base_url,
        "hi",
        llm_server("looper").endpoint_url,
        thread_id=new_thread(),
        recursion_limit=4,
    )
    assert steps_of(events)[-1]["content"] == CANNED_REPLY
    assert events[-1]["type"] == "complete"
    assert events[-1]["recursion_limit_reached"] is False


def test_an_artifact_turn_carries_the_document_and_records_the_turn(
    backend: BackendServer, llm_server: LlmServers
) -> None:
    thread = new_thread()
    events = run_turn(
        backend.base_url,
        "Write a report on Crete.",
        llm_server("helpful").endpoint_url,
        thread_id=thread,
    )
    call, result, answer = steps_of(events)
    assert call["message_type"] == "ai"
    assert call["tool_calls"][0]["name"] == "write_document"
    assert call["tool_calls"][0]["args"]["action_and_reasoning"]
    assert result["message_type"] == "tool"
    assert result["tool_error"] is False
    assert result["artifact"]["type"] == "document"
    assert result["artifact"]["title"] == call["tool_calls"][0]["args"]["title"]
    assert answer["message_type"] == "ai"
    assert answer["content"]
    assert answer["artifact"] is None
    assert events[-1]["recursion_limit_reached"] is False
    (row,) = backend.snapshots(thread)
    assert row["provider"] == "vllm"
    assert row["model_id"] == MODEL
    assert row["turn_index"] == 0
    assert row["branch_from"] is None
    assert row["outcome"] == "complete"
    assert row["snapshot_id"] is not None
    assert row["created_at"] is not None


def test_invalid_tool_arguments_are_fed_back_and_flagged(
    backend: BackendServer, llm_server: LlmServers
) -> None:
    events = run_turn(
        backend.base_url,
        "hi",
        llm_server("bad_args").endpoint_url,
        thread_id=new_thread(),
        recursion_limit=6,
    )
    steps = steps_of(events)
    tool_steps = [s for s in steps if s["message_type"] == "tool"]
    assert len(tool_steps) == 2
    assert all(s["tool_error"] is True and s["artifact"] is None for s in tool_steps)
    assert "action_and_reasoning" in tool_steps[0]["content"]
    assert steps[-1]["content"] == CANNED_REPLY
    assert events[-1]["recursion_limit_reached"] is True


def test_turns_of_a_thread_are_numbered_in_order(
    backend: BackendServer, llm_server: LlmServers
) -> None:
    thread = new_thread()
    endpoint = llm_server("helpful").endpoint_url
    indices = [
        run_turn(backend.base_url, f"q{i}", endpoint, thread_id=thread)[-1]["turn_index"]
        for i in range(3)
    ]
    assert indices == [0, 1, 2]
    assert [r["turn_index"] for r in backend.snapshots(thread)] == [0, 1, 2]


def test_a_branch_forks_the_thread_from_the_state_after_the_turn(
    backend: BackendServer, llm_server: LlmServers
) -> None:
    thread = new_thread()
    endpoint = llm_server("helpful").endpoint_url
    run_turn(backend.base_url, "Plan a trip to Crete.", endpoint, thread_id=thread)
    main = run_turn(backend.base_url, "Make it cheaper.", endpoint, thread_id=thread)
    branch = run_turn(
        backend.base_url, "Make it cheaper.", endpoint, thread_id=thread, branch_from_turn=0
    )
    fork = branch[-1]
    assert fork["type"] == "complete"
    assert fork["thread_id"].startswith(f"{thread}.b0.")
    assert fork["turn_index"] == 1
    assert {e["thread_id"] for e in branch if e["type"] == "step"} == {fork["thread_id"]}
    # Same history and query as the main thread's turn 1: the model saw exactly that.
    assert steps_of(branch) == steps_of(main)
    assert fork["usage"] == main[-1]["usage"]
    rows = {(r["thread_id"], r["turn_index"]): r for r in backend.snapshots(thread)}
    row = rows[(fork["thread_id"], 1)]
    assert row["branch_from"] == 0
    assert row["parent_thread_id"] == thread
    assert row["provider"] == "vllm"
    assert rows[(thread, 1)]["branch_from"] is None

    then = run_turn(backend.base_url, "Thanks.", endpoint, thread_id=fork["thread_id"])
    assert (then[-1]["thread_id"], then[-1]["turn_index"]) == (fork["thread_id"], 2)
    # A branch of the branch, from a turn that lives in the original thread.
    again = run_turn(
        backend.base_url,
        "Make it cheaper.",
        endpoint,
        thread_id=fork["thread_id"],
        branch_from_turn=0,
    )
    assert again[-1]["thread_id"].startswith(f"{fork['thread_id']}.b0.")
    assert steps_of(again) == steps_of(main)


def test_a_branch_from_a_missing_turn_is_400(
    backend: BackendServer, llm_server: LlmServers
) -> None:
    thread = new_thread()
    endpoint = llm_server("helpful").endpoint_url
    run_turn(backend.base_url, "hi", endpoint, thread_id=thread)
    body = {
        "query": "x",
        "thread_id": thread,
        "branch_from_turn": 3,
        "config": {"model": {"API": "openai", "model_id": MODEL, "endpoint_url": endpoint}},
    }
    response = post_query(backend.base_url, body)
    assert response.status_code == 400
    assert response.json()["detail"] == f"thread {thread!r} has no turn 3 to branch from"


def test_a_substitute_model_is_what_the_snapshot_records(
    backend_server: BackendServers, llm_server: LlmServers
) -> None:
    backend = backend_server(**VARIANT)
    thread = new_thread()
    events = run_turn(backend.base_url, "hi", llm_server("helpful").endpoint_url, thread_id=thread)
    assert events[-1]["type"] == "complete"
    (row,) = backend.snapshots(thread)
    assert (row["provider"], row["model_id"]) == ("vllm", "other-model")


def test_a_model_500_is_an_error_of_kind_model(
    backend: BackendServer, llm_server: LlmServers
) -> None:
    endpoint = llm_server("flaky").endpoint_url
    # Which conversations flaky fails is fixed by its seed; one of the first few fails.
    for index in range(20):
        thread = new_thread()
        events = run_turn(backend.base_url, f"question {index}", endpoint, thread_id=thread)
        if events[-1]["type"] == "error":
            break
    assert events[-1]["kind"] == "model"
    assert "500" in events[-1]["error"]
    (row,) = backend.snapshots(thread)
    assert (row["outcome"], row["error_kind"]) == ("error", "model")


def test_an_unreachable_model_is_an_error_of_kind_model(backend: BackendServer) -> None:
    endpoint = f"http://vllm.localhost:{free_port()}/v1"
    events = run_turn(backend.base_url, "hi", endpoint, thread_id=new_thread())
    assert (events[-1]["type"], events[-1]["kind"]) == ("error", "model")


def test_a_model_refusing_the_key_is_an_error_of_kind_auth(
    backend: BackendServer, llm_server: LlmServers
) -> None:
    endpoint = llm_server("helpful", api_key="another-key").endpoint_url
    events = run_turn(backend.base_url, "hi", endpoint, thread_id=new_thread())
    assert (events[-1]["type"], events[-1]["kind"]) == ("error", "auth")
