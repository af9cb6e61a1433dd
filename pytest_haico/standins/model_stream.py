"""The backend's streamed model reply, merged as it arrives instead of chunk by chunk.

ChatOpenAI turns every streamed chunk into a LangChain message chunk (a pydantic model), waits
for each under a task of its own (its per-chunk timeout), reports it to the callbacks, and
merges them all once the stream ends: CPU for every token, which nobody reads one at a time
(the backend streams steps, not tokens). `LeanChatOpenAI` reads the same stream but merges
the deltas of the first choice into one chunk as they come (content appended, each tool
call's id, name and arguments by its index, as LangChain's merge does), bounds the wait for
each chunk on one timer, and hands ChatOpenAI's own conversion that one chunk, then any chunk
without choices (the usage) as it is. The request, the message LangGraph gets and the errors
raised are ChatOpenAI's (tests/standins hold the two to that).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import openai
from langchain_core.callbacks import AsyncCallbackManagerForLLMRun
from langchain_core.messages import AIMessageChunk, BaseMessage
from langchain_core.outputs import ChatGenerationChunk
from langchain_openai import ChatOpenAI
from langchain_openai.chat_models._client_utils import StreamChunkTimeoutError
from langchain_openai.chat_models.base import _handle_openai_api_error, _handle_openai_bad_request

# Top-level fields of a chunk that ChatOpenAI reads from the one with the finish reason.
_FINISH_FIELDS = ("model", "system_fingerprint", "service_tier")


class StreamMerge:
    """The deltas of a stream's first choice, merged; the chunks without choices, kept."""

    def __init__(self) -> None:
        self._content: list[str] = []
        self._calls: dict[Any, dict[str, Any]] = {}  # by index, in order of appearance
        self._finish: dict[str, Any] | None = None  # the chunk that had the finish reason
        self._deltas = 0
        self.others: list[dict[str, Any]] = []  # no choices: the usage, as ChatOpenAI reads it

    def add(self, chunk: dict[str, Any]) -> None:
        """Take one chunk of the stream, as the SDK decoded it."""
        choices = chunk.get("choices") or []
        if not choices:
            self.others.append(chunk)
            return
        choice = choices[0]
        delta = choice.get("delta")
        if delta is None:  # ChatOpenAI skips such a chunk, finish reason and all
            return
        self._deltas += 1
        if content := delta.get("content"):
            self._content.append(content)
        if raw_calls := delta.get("tool_calls"):
            self._add_calls(raw_calls)
        if choice.get("finish_reason"):
            self._finish = {"finish_reason": choice["finish_reason"]} | {
                name: chunk[name] for name in _FINISH_FIELDS if name in chunk
            }

    def _add_calls(self, raw_calls: list[dict[str, Any]]) -> None:
        try:  # a malformed one costs ChatOpenAI that chunk's tool calls, not the reply
            pieces = [(raw["index"], raw.get("id"), raw["function"]) for raw in raw_calls]
        except KeyError:
            return
        for index, call_id, function in pieces:
            call = self._calls.setdefault(index, {"id": None, "name": None, "arguments": None})
            # LangChain's merge: a new value fills a missing one, an equal id is kept once,
            # any other string is appended.
            for key, value in (
                ("id", call_id),
                ("name", function.get("name")),
                ("arguments", function.get("arguments")),
            ):
                if value is None or (key == "id" and call[key] == value):
                    continue
                call[key] = value if call[key] is None else call[key] + value

    def merged(self) -> dict[str, Any] | None:
        """One chunk holding every delta (None if none came), in the stream's own shape."""
        if not self._deltas:
            return None
        delta: dict[str, Any] = {"role": "assistant", "content": "".join(self._content)}
        if self._calls:
            delta["tool_calls"] = [
                {
                    "index": index,
                    "id": call["id"],
                    "function": {"name": call["name"], "arguments": call["arguments"]},
                }
                for index, call in self._calls.items()
            ]
        finish = self._finish or {}
        fields = {name: finish[name] for name in _FINISH_FIELDS if name in finish}
        choice = {"index": 0, "delta": delta, "finish_reason": finish.get("finish_reason")}
        return {"choices": [choice], **fields}


class LeanChatOpenAI(ChatOpenAI):
    """ChatOpenAI whose asynchronous stream is merged as it arrives (see the module)."""

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        *,
        stream_usage: bool | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        kwargs["stream"] = True
        if include_usage := self._should_stream_usage(stream_usage, **kwargs):
            kwargs["stream_options"] = {"include_usage": include_usage}
        payload = self._get_request_payload(messages, stop=stop, **kwargs)
        merge = StreamMerge()
        try:
            response = await self.async_client.create(**payload)
            async with response:
                await self._read(response, merge)
        except openai.BadRequestError as exc:
            _handle_openai_bad_request(exc)  # raises LangChain's error for it
        except openai.APIError as exc:
            _handle_openai_api_error(exc)  # raises LangChain's error for it
        merged = merge.merged()
        for chunk in ([merged] if merged is not None else []) + merge.others:
            generation = self._convert_chunk_to_generation_chunk(chunk, AIMessageChunk, {})
            if generation is None:
                continue
            if run_manager:
                await run_manager.on_llm_new_token(generation.text, chunk=generation)
            yield generation

    async def _read(self, response: AsyncIterator[Any], merge: StreamMerge) -> None:
        """Every chunk into `merge`; no chunk waited for longer than `stream_chunk_timeout`."""
        limit = self.stream_chunk_timeout
        if not limit or limit <= 0:
            async for chunk in response:
                merge.add(_as_dict(chunk))
            return
        loop = asyncio.get_running_loop()
        received = 0
        try:
            async with asyncio.timeout(limit) as bound:
                async for chunk in response:
                    received += 1
                    merge.add(_as_dict(chunk))
                    bound.reschedule(loop.time() + limit)
        except TimeoutError as exc:
            if not bound.expired():
                raise
            raise StreamChunkTimeoutError(
                limit, model_name=self.model_name, chunks_received=received
            ) from exc


def _as_dict(chunk: Any) -> dict[str, Any]:
    """A chunk as `LeanCompletions` yields it (a dict), whatever client read it."""
    return chunk if isinstance(chunk, dict) else chunk.model_dump()
