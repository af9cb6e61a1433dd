"""The stand-in backend's agent: LangGraph's prebuilt ReAct agent, its tool, steps and errors."""

from __future__ import annotations

import warnings
from collections import OrderedDict
from typing import Any

import httpx
import openai
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.errors import GraphRecursionError
from langgraph.graph.state import CompiledStateGraph
from langgraph.prebuilt import ToolNode, create_react_agent
from langgraph.warnings import LangGraphDeprecatedSinceV10
from pydantic import BaseModel, Field

from pytest_haico.standins.backend_wire import ErrorKind, ModelConfig
from pytest_haico.standins.model_client import ModelHttpClients, build_chat_model

Graph = CompiledStateGraph[Any, Any, Any, Any]

# What create_react_agent answers instead of a tool call when the recursion limit is near.
CANNED_REPLY = "Sorry, need more steps to process this request."
# Never called: the warm-up only builds a model client for it.
_WARM_UP_URL = "http://vllm.localhost:9/v1"


class WriteDocumentArgs(BaseModel):
    """Arguments of ``write_document``; ``action_and_reasoning`` is required, as in HAI-Co²."""

    action_and_reasoning: str = Field(description="What you are doing and why, in one sentence.")
    title: str = Field(description="The document's title.")
    content: str = Field(description="The document's full text.")


@tool("write_document", args_schema=WriteDocumentArgs, response_format="content_and_artifact")
def write_document(
    action_and_reasoning: str, title: str, content: str
) -> tuple[str, dict[str, str]]:
    """Write a document for the user; they see it as an artifact next to the conversation."""
    artifact = {"type": "document", "title": title, "content": content}
    return f"Wrote the document {title!r} ({len(content)} characters).", artifact


def build_agent(model: BaseChatModel, checkpointer: BaseCheckpointSaver[Any]) -> Graph:
    """LangGraph's prebuilt ReAct agent over *model*, checkpointed by *checkpointer*.

    ``create_react_agent`` is deprecated but is the builder that answers the canned reply at
    an even recursion limit, which is the behaviour this stand-in exists to reproduce. Its
    ToolNode keeps the default error handling: an argument that fails validation becomes an
    error ToolMessage fed back to the model; any other tool failure propagates.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LangGraphDeprecatedSinceV10)
        return create_react_agent(model, ToolNode([write_document]), checkpointer=checkpointer)


class AgentCache:
    """The compiled agent for each model config a request names, built on first use.

    Building ChatOpenAI and compiling the graph (``create_react_agent`` inspects every node's
    signature and bytecode) cost about 6 ms of CPU, more than a turn's own graph work; a
    campaign sends the same config on every turn. Both are stateless between runs: the
    thread's state lives in the checkpointer, so one compiled graph serves concurrent turns.
    """

    def __init__(
        self,
        checkpointer: BaseCheckpointSaver[Any],
        *,
        http_clients: ModelHttpClients,
        api_key: str | None,
        size: int = 16,
    ) -> None:
        self._checkpointer = checkpointer
        self._http_clients = http_clients
        self._api_key = api_key
        self._size = size
        self._graphs: OrderedDict[ModelConfig, Graph] = OrderedDict()

    def get(self, config: ModelConfig) -> Graph:
        """The agent for *config*; the least recently used one is dropped past *size*."""
        graph = self._graphs.get(config)
        if graph is None:
            graph = self._graphs[config] = self._build(config)
            while len(self._graphs) > self._size:
                self._graphs.popitem(last=False)
        else:
            self._graphs.move_to_end(config)
        return graph

    def _build(self, config: ModelConfig) -> Graph:
        model = build_chat_model(config, api_key=self._api_key, http_clients=self._http_clients)
        return build_agent(model, self._checkpointer)


def warm_up(checkpointer: BaseCheckpointSaver[Any], *, http_clients: ModelHttpClients) -> None:
    """Build (and drop) an agent for a placeholder endpoint, at start-up.

    The first ChatOpenAI and the first compilation import and initialise about 0.1 s worth
    of modules; done here, that stays out of the first turn, where every turn in flight
    would wait for it. *checkpointer* is only compiled in, never called.
    """
    config = ModelConfig(API="openai", model_id="warm-up", endpoint_url=_WARM_UP_URL)
    model = build_chat_model(config, api_key=None, http_clients=http_clients)
    build_agent(model, checkpointer)


def step_fields(message: BaseMessage) -> dict[str, Any]:
    """The ``step`` object of an SSE step event for one message the graph produced."""
    step: dict[str, Any] = {
        "content": str(message.text),
        "message_type": message.type,
        "tool_calls": [],
        "tool_error": False,
        "artifact": None,
    }
    if isinstance(message, AIMessage):
        step["tool_calls"] = [
            {"id": call["id"], "name": call["name"], "args": call["args"]}
            for call in message.tool_calls
        ]
    elif isinstance(message, ToolMessage):
        step["tool_error"] = message.status == "error"
        step["artifact"] = message.artifact
    return step


def is_canned_reply(message: BaseMessage) -> bool:
    """Whether *message* is LangGraph's canned reply at the recursion limit."""
    return (
        isinstance(message, AIMessage)
        and not message.tool_calls
        and str(message.text).strip() == CANNED_REPLY
    )


def classify_error(exc: BaseException) -> ErrorKind:
    """The error kind of an exception that ended a turn."""
    if isinstance(exc, GraphRecursionError):
        return "recursion_limit"
    if isinstance(exc, openai.AuthenticationError | openai.PermissionDeniedError):
        return "auth"
    # Unreachable, timed out, 5xx, or a 4xx such as tools refused: the model did not serve it.
    if isinstance(exc, openai.APIError | httpx.HTTPError):
        return "model"
    return "internal"
