"""One turn of the stand-in backend: its thread and branch, the agent run, its row, its events."""

from __future__ import annotations

import dataclasses
import logging
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

from langchain_core.callbacks import UsageMetadataCallbackHandler
from langchain_core.messages import BaseMessage, HumanMessage
from langchain_core.runnables import RunnableConfig

from pytest_haico.redact import Redactor
from pytest_haico.standins.agent import Graph, classify_error, is_canned_reply, step_fields
from pytest_haico.standins.backend_wire import (
    ErrorKind,
    QueryRequest,
    complete_event,
    error_event,
    step_event,
)
from pytest_haico.standins.snapshots import Snapshot, SnapshotStore

logger = logging.getLogger("pytest_haico.standins.backend")


class TurnRefusedError(Exception):
    """The request names a turn that cannot run (answered 400 before any event)."""


@dataclass(frozen=True)
class TurnPlan:
    """Where a turn runs.

    A branch (``branch_from_turn = k``) runs in a NEW thread, ``<thread>.b<k>.<8 hex>``, whose
    first turn starts from the messages of the state after turn k and has index k + 1;
    ``parent_thread_id`` is the thread the request named. Later turns on the branch send the
    new thread id (the events carry it).
    """

    thread_id: str
    turn_index: int | None  # None: the thread's next index, assigned when the turn starts
    branch_from: int | None = None
    parent_thread_id: str | None = None
    history: tuple[BaseMessage, ...] = ()


class TurnUsage(UsageMetadataCallbackHandler):
    """The tokens of a turn's model calls, counted on the event loop.

    LangChain runs a synchronous handler through the loop's thread pool for every event of
    every run in the graph (each node's start and end, each streamed token): a thread hop
    each, about 5 ms of CPU a turn. Counting needs only ``on_llm_end``, which does no I/O,
    so this handler runs inline and skips the events it has no use for.
    """

    run_inline = True

    @property
    def ignore_chain(self) -> bool:
        return True

    @property
    def ignore_agent(self) -> bool:
        return True

    @property
    def ignore_chat_model(self) -> bool:
        return True

    @property
    def ignore_retriever(self) -> bool:
        return True

    @property
    def ignore_retry(self) -> bool:
        return True

    @property
    def ignore_custom_event(self) -> bool:
        return True


@dataclass(frozen=True)
class TurnRecording:
    """What the turn's snapshot row records about the model, and what must not be echoed."""

    provider: str
    model_id: str
    recursion_flag: bool
    redactor: Redactor


async def plan_turn(request: QueryRequest, *, graph: Graph, store: SnapshotStore) -> TurnPlan:
    """Resolve the request's thread, branch and turn index; raise TurnRefusedError if impossible."""
    if request.branch_from_turn is None:
        return TurnPlan(request.thread_id or str(uuid.uuid4()), None)
    if request.thread_id is None:
        raise TurnRefusedError("branch_from_turn needs the thread_id of the thread to branch")
    fork_turn = request.branch_from_turn
    source = await store.find_turn(request.thread_id, fork_turn)
    if source is None:
        raise TurnRefusedError(
            f"thread {request.thread_id!r} has no turn {fork_turn} to branch from"
        )
    # Forking into a fresh thread with the fork point's messages as input keeps LangGraph in
    # its ordinary "new input" path; copying raw checkpoints would depend on channel internals.
    state = await graph.aget_state(
        {
            "configurable": {
                "thread_id": source.thread_id,
                "checkpoint_id": source.checkpoint_id,
            }
        }
    )
    history = tuple(state.values.get("messages", ()))
    thread_id = f"{request.thread_id}.b{fork_turn}.{uuid.uuid4().hex[:8]}"
    return TurnPlan(thread_id, fork_turn + 1, fork_turn, request.thread_id, history)


async def assign_turn_index(plan: TurnPlan, store: SnapshotStore) -> TurnPlan:
    """*plan* with its turn index; call it while holding the thread's lock."""
    if plan.turn_index is not None:
        return plan
    return dataclasses.replace(plan, turn_index=await store.next_turn_index(plan.thread_id))


async def aiter_turn_events(
    plan: TurnPlan,
    *,
    query: str,
    recursion_limit: int,
    graph: Graph,
    store: SnapshotStore,
    recording: TurnRecording,
) -> AsyncIterator[dict[str, Any]]:
    """Run the turn and yield its events: steps, then ``complete`` or ``error``.

    The snapshot row is written before the last event, so a client that reads
    ``workspace_snapshots`` after the event always finds it.
    """
    plan = await assign_turn_index(plan, store)
    turn_index = plan.turn_index
    assert turn_index is not None
    # Usage is counted per model call, not per emitted message: at the recursion limit
    # LangGraph replaces the last response with its canned reply, which carries no usage.
    usage = TurnUsage()
    config: RunnableConfig = {
        "configurable": {"thread_id": plan.thread_id},
        "recursion_limit": recursion_limit,
        "callbacks": [usage],
    }
    steps = 0
    last: BaseMessage | None = None
    failure: tuple[ErrorKind, str] | None = None
    inputs = {"messages": [*plan.history, HumanMessage(query)]}
    try:
        async for update in graph.astream(inputs, config, stream_mode="updates"):
            for message in _iter_messages(update):
                last = message
                steps += 1
                yield step_event(plan.thread_id, turn_index, **step_fields(message))
    except Exception as exc:
        kind = classify_error(exc)
        if kind == "internal":
            logger.exception("turn %d of thread %s failed", turn_index, plan.thread_id)
        failure = (kind, recording.redactor.redact(str(exc) or type(exc).__name__))
    reached = last is not None and is_canned_reply(last)
    tokens_in = sum(u["input_tokens"] for u in usage.usage_metadata.values())
    tokens_out = sum(u["output_tokens"] for u in usage.usage_metadata.values())
    try:
        # The row takes the thread's newest checkpoint id in the same statement: the run has
        # awaited its checkpoint writes, and the thread's lock keeps other turns out.
        await store.record(
            Snapshot(
                thread_id=plan.thread_id,
                turn_index=turn_index,
                branch_from=plan.branch_from,
                parent_thread_id=plan.parent_thread_id,
                provider=recording.provider,
                model_id=recording.model_id,
                outcome="complete" if failure is None else "error",
                error_kind=None if failure is None else failure[0],
                tokens_in=tokens_in,
                tokens_out=tokens_out,
            )
        )
    except Exception as exc:
        logger.exception("recording turn %d of thread %s failed", turn_index, plan.thread_id)
        detail = recording.redactor.redact(f"recording the turn failed: {exc}")
        failure = failure or ("internal", detail)
    logger.info(
        "turn %d of thread %s: %d steps, %s",
        turn_index,
        plan.thread_id,
        steps,
        f"error {failure[0]}: {failure[1]}" if failure else f"complete (canned reply: {reached})",
    )
    if failure is not None:
        yield error_event(*failure)
    else:
        yield complete_event(
            plan.thread_id,
            turn_index,
            recursion_limit_reached=reached and recording.recursion_flag,
            tokens_in=tokens_in,
            tokens_out=tokens_out,
        )


def _iter_messages(update: Any) -> Iterator[BaseMessage]:
    """The messages of one ``updates`` chunk: ``{node: {"messages": [...]}}``."""
    if not isinstance(update, dict):
        return
    for values in update.values():
        for value in values if isinstance(values, list | tuple) else [values]:
            if isinstance(value, dict):
                yield from (m for m in value.get("messages", ()) if isinstance(m, BaseMessage))
