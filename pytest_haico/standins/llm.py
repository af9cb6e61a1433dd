"""``python -m pytest_haico.standins.llm``: a stand-in for the OpenAI API of ``vllm serve``."""

from __future__ import annotations

import argparse
import asyncio
import hmac
import json
import logging
import os
import sys
import time
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass

from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from pytest_haico.standins.openai_wire import (
    ChatRequest,
    NamedToolChoice,
    Usage,
    completion_body,
    count_completion_tokens,
    count_prompt_tokens,
    error_body,
    iter_chunk_bodies,
    sse_data,
    truncate,
)
from pytest_haico.standins.personas import Hang, Persona, ServerFault, plan_completion
from pytest_haico.standins.serving import configure_logging, positive_int, run_app

logger = logging.getLogger("pytest_haico.standins.llm")

API_KEY_ENV = "VLLM_API_KEY"
# vLLM's own wording, so that clients and gates that match on it see the real thing.
TOOLS_WITHOUT_FLAG = (
    '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'
)


@dataclass(frozen=True)
class LlmSettings:
    """The stand-in model server's resolved command line and environment."""

    model: str
    served_model_names: tuple[str, ...]
    host: str
    port: int
    max_model_len: int
    auto_tool_choice: bool
    tool_call_parser: str | None
    persona: Persona
    latency_ms: int
    load_s: float
    seed: int
    api_key: str | None


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The command line, shaped like ``vllm serve``'s (only the flags a stand-in acts on)."""
    parser = argparse.ArgumentParser(
        prog="python -m pytest_haico.standins.llm",
        description="Stand-in for vLLM's OpenAI-compatible server. The API key is read "
        f"from ${API_KEY_ENV} only.",
    )
    parser.add_argument("--model", required=True, help="the model (a name for the stand-in)")
    parser.add_argument(
        "--served-model-name", nargs="+", default=None, help="names to serve (default: --model)"
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind, exactly")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--max-model-len", type=positive_int, default=8192)
    parser.add_argument("--enable-auto-tool-choice", action="store_true")
    parser.add_argument("--tool-call-parser", default=None)
    parser.add_argument(
        "--persona", choices=[p.value for p in Persona], default=Persona.HELPFUL.value
    )
    parser.add_argument("--latency-ms", type=_non_negative, default=0)
    parser.add_argument(
        "--load-s",
        type=float,
        default=0.0,
        help="seconds to 'load the model' before listening, as vLLM does (default 0)",
    )
    parser.add_argument("--seed", type=int, default=0)
    # Refused rather than unknown: argv is readable by every user of the node.
    parser.add_argument("--api-key", help=argparse.SUPPRESS)
    return parser


def parse_settings(argv: Sequence[str], environ: Mapping[str, str]) -> LlmSettings:
    """Resolve the command line and the environment; exit 2 with a message on a bad value."""
    parser = build_parser()
    args = parser.parse_args(list(argv))
    if args.api_key is not None:
        parser.error(f"--api-key is not accepted (argv is public): set ${API_KEY_ENV} instead")
    if args.enable_auto_tool_choice and not args.tool_call_parser:
        parser.error("--enable-auto-tool-choice requires --tool-call-parser to be set")
    model = str(args.model)
    return LlmSettings(
        model=model,
        served_model_names=tuple(args.served_model_name or [model]),
        host=str(args.host),
        port=int(args.port),
        max_model_len=int(args.max_model_len),
        auto_tool_choice=bool(args.enable_auto_tool_choice),
        tool_call_parser=args.tool_call_parser,
        persona=Persona(args.persona),
        latency_ms=int(args.latency_ms),
        load_s=max(0.0, float(args.load_s)),
        seed=int(args.seed),
        api_key=environ.get(API_KEY_ENV) or None,
    )


def _error(code: int, error_type: str, message: str) -> JSONResponse:
    return JSONResponse(error_body(message, error_type=error_type, code=code), status_code=code)


class _LlmApp:
    """The request handlers; one instance per process, stateless between requests."""

    def __init__(self, settings: LlmSettings, stopping: asyncio.Event) -> None:
        self.settings = settings
        self.stopping = stopping

    def _authorized(self, request: Request) -> bool:
        if self.settings.api_key is None:
            return True
        given = request.headers.get("authorization", "").encode()
        return hmac.compare_digest(given, f"Bearer {self.settings.api_key}".encode())

    async def health(self, request: Request) -> Response:
        return Response(status_code=200)

    async def models(self, request: Request) -> Response:
        if not self._authorized(request):
            return JSONResponse({"error": "Unauthorized"}, status_code=401)
        created = int(time.time())
        data = [
            {
                "id": name,
                "object": "model",
                "created": created,
                "owned_by": "vllm",
                "root": self.settings.model,
                "parent": None,
                "max_model_len": self.settings.max_model_len,
            }
            for name in self.settings.served_model_names
        ]
        return JSONResponse({"object": "list", "data": data})

    async def chat_completions(self, request: Request) -> Response:
        if not self._authorized(request):
            return JSONResponse({"error": "Unauthorized"}, status_code=401)
        try:
            chat = ChatRequest.model_validate(json.loads(await request.body()))
        except (ValueError, ValidationError) as exc:
            return _error(400, "BadRequestError", f"invalid chat completion request: {exc}")
        refusal = self._refusal(chat)
        if refusal is not None:
            return refusal
        prompt_tokens = count_prompt_tokens(chat)
        limit = chat.token_limit
        if prompt_tokens + (limit or 1) > self.settings.max_model_len:
            return _error(
                400,
                "BadRequestError",
                f"This model's maximum context length is {self.settings.max_model_len} tokens. "
                f"However, you requested {prompt_tokens + (limit or 0)} tokens "
                f"({prompt_tokens} in the messages, {limit or 0} in the completion). "
                "Please reduce the length of the messages or completion.",
            )
        plan = plan_completion(
            chat,
            persona=self.settings.persona,
            seed=self.settings.seed,
            latency_ms=self.settings.latency_ms,
        )
        if plan.delay_s:
            await asyncio.sleep(plan.delay_s)
        if isinstance(plan.outcome, Hang):
            logger.info("persona hang holds the request until the client goes away")
            await self._until_gone(request)
            return _error(503, "ServiceUnavailableError", "the server is shutting down")
        if isinstance(plan.outcome, ServerFault):
            logger.info("persona %s fails this request with 500", self.settings.persona.value)
            return _error(500, "InternalServerError", "stand-in engine error (persona flaky)")
        budget = limit if limit is not None else self.settings.max_model_len - prompt_tokens
        reply, finish_reason = truncate(plan.outcome, budget)
        usage = Usage(prompt_tokens, count_completion_tokens(reply))
        served = chat.model or self.settings.served_model_names[0]
        completion_id = f"chatcmpl-{uuid.uuid4().hex}"
        created = int(time.time())
        if not chat.stream:
            body = completion_body(
                completion_id=completion_id,
                created=created,
                model=served,
                reply=reply,
                finish_reason=finish_reason,
                usage=usage,
            )
            return JSONResponse(body)
        bodies = list(
            iter_chunk_bodies(
                completion_id=completion_id,
                created=created,
                model=served,
                reply=reply,
                finish_reason=finish_reason,
                usage=usage if chat.include_usage else None,
            )
        )

        async def aiter_events() -> AsyncIterator[str]:
            for chunk in bodies:
                yield sse_data(chunk)
            yield sse_data("[DONE]")

        return StreamingResponse(aiter_events(), media_type="text/event-stream")

    def _refusal(self, chat: ChatRequest) -> Response | None:
        """The 4xx vLLM gives before generating anything, or None."""
        served = chat.model or self.settings.served_model_names[0]
        if served not in self.settings.served_model_names:
            return _error(404, "NotFoundError", f"The model `{served}` does not exist.")
        if chat.tools and not self.settings.auto_tool_choice:
            return _error(400, "BadRequestError", TOOLS_WITHOUT_FLAG)
        choice = chat.tool_choice
        if (isinstance(choice, NamedToolChoice) or choice == "required") and not chat.tools:
            return _error(400, "BadRequestError", "When using `tool_choice`, `tools` must be set.")
        names = {t.function.name for t in chat.tools or []}
        if isinstance(choice, NamedToolChoice) and choice.function.name not in names:
            return _error(
                400,
                "BadRequestError",
                f"Tool '{choice.function.name}' has not been passed in `tools`.",
            )
        return None

    async def _until_gone(self, request: Request) -> None:
        """Wait until the client disconnects or the server is told to stop."""
        stopping = asyncio.ensure_future(self.stopping.wait())
        try:
            while not stopping.done():
                receive = asyncio.ensure_future(request.receive())
                await asyncio.wait({receive, stopping}, return_when=asyncio.FIRST_COMPLETED)
                if not receive.done():
                    receive.cancel()
                elif receive.result()["type"] == "http.disconnect":
                    return
        finally:
            stopping.cancel()


def build_app(settings: LlmSettings, *, stopping: asyncio.Event) -> Starlette:
    """The ASGI app: ``/health``, ``/v1/models``, ``/v1/chat/completions``."""
    handlers = _LlmApp(settings, stopping)
    return Starlette(
        routes=[
            Route("/health", handlers.health, methods=["GET"]),
            Route("/v1/models", handlers.models, methods=["GET"]),
            Route("/v1/chat/completions", handlers.chat_completions, methods=["POST"]),
        ]
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the stand-in until SIGTERM/SIGINT."""
    settings = parse_settings(sys.argv[1:] if argv is None else argv, os.environ)
    configure_logging([settings.api_key or ""])
    stopping = asyncio.Event()
    logger.info(
        "stand-in vLLM: model %s, persona %s, seed %d, latency %d ms, auth %s",
        settings.served_model_names[0],
        settings.persona.value,
        settings.seed,
        settings.latency_ms,
        "on" if settings.api_key else "off",
    )
    if settings.load_s:
        # Like vLLM: nothing listens (so /health is refused) until the weights are in.
        logger.info("loading the model: %.1f s", settings.load_s)
        time.sleep(settings.load_s)
    return run_app(
        build_app(settings, stopping=stopping),
        host=settings.host,
        port=settings.port,
        stopping=stopping,
    )


if __name__ == "__main__":
    sys.exit(main())
