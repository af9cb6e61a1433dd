"""``python -m pytest_haico.standins.llm``: a stand-in for the OpenAI API of ``vllm serve``."""

from __future__ import annotations

import argparse
import asyncio
import hmac
import json
import logging
import os
import re
import sys
import time
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass

from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from pytest_haico import __version__
from pytest_haico.standins.engine_stats import METRICS_CONTENT_TYPE, EngineStats, render_metrics
from pytest_haico.standins.openai_wire import (
    ChatRequest,
    Usage,
    completion_body,
    count_completion_tokens,
    count_prompt_tokens,
    error_body,
    iter_chunk_bodies,
    model_list,
    reported_finish_reason,
    sse_data,
    truncate,
)
from pytest_haico.standins.personas import (
    EngineDeath,
    Hang,
    Persona,
    ServerFault,
    plan_completion,
)
from pytest_haico.standins.refusals import (
    Refusal,
    context_refusal,
    invalid_request,
    tool_choice_refusal,
    unknown_model,
)
from pytest_haico.standins.serving import configure_logging, positive_int, run_app
from pytest_haico.standins.vllm_versions import (
    DEFAULT_VLLM_VERSION,
    VllmVersion,
    parse_vllm_version,
)

logger = logging.getLogger("pytest_haico.standins.llm")
# The field of GET /version by which the stand-in says it is one (pytest-haico's version).
STANDIN_VERSION_FIELD = "haico_standin"

API_KEY_ENV = "VLLM_API_KEY"
# vLLM's default --max-num-seqs (V1 engine, most GPUs).
DEFAULT_MAX_NUM_SEQS = 256


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
    max_num_seqs: int
    vllm_version: VllmVersion
    persona: Persona
    latency_ms: int
    load_s: float
    blank_on: re.Pattern[str] | None
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
        "--max-num-seqs",
        type=positive_int,
        default=DEFAULT_MAX_NUM_SEQS,
        help="requests running at once; the rest wait (default %(default)s)",
    )
    parser.add_argument(
        "--vllm-version",
        type=parse_vllm_version,
        default=parse_vllm_version(DEFAULT_VLLM_VERSION),
        metavar="X.Y.Z",
        help="the vLLM release to imitate where releases differ: tool_choice without a "
        "tool-call parser (0.14 refuses named and required), error bodies (flat before "
        "0.10.1), /health of a dead engine, cache-usage metric names; GET /version reports "
        f"it (stand-in only; default {DEFAULT_VLLM_VERSION})",
    )
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
    parser.add_argument("--blank-on", type=re.compile, help="[standin] blank_on's REGEX")
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
        max_num_seqs=int(args.max_num_seqs),
        vllm_version=args.vllm_version,
        persona=Persona(args.persona),
        latency_ms=int(args.latency_ms),
        load_s=max(0.0, float(args.load_s)),
        blank_on=args.blank_on,
        seed=int(args.seed),
        api_key=environ.get(API_KEY_ENV) or None,
    )


class _LlmApp:
    """The request handlers and the engine's state; one instance per process."""

    def __init__(self, settings: LlmSettings, stopping: asyncio.Event) -> None:
        self.settings = settings
        self.stopping = stopping
        self.stats = EngineStats(
            max_num_seqs=settings.max_num_seqs, max_model_len=settings.max_model_len
        )
        self.engine_dead = False

    def _authorized(self, request: Request) -> bool:
        if self.settings.api_key is None:
            return True
        given = request.headers.get("authorization", "").encode()
        return hmac.compare_digest(given, f"Bearer {self.settings.api_key}".encode())

    def _error(self, refusal: Refusal) -> JSONResponse:
        body = error_body(
            refusal.message,
            error_type=refusal.error_type,
            code=refusal.code,
            nested=self.settings.vllm_version.nests_errors,
            param=refusal.param,
        )
        return JSONResponse(body, status_code=refusal.code)

    async def health(self, request: Request) -> Response:
        if self.engine_dead:
            return Response(status_code=self.settings.vllm_version.dead_health_status)
        return Response(status_code=200)

    async def version(self, request: Request) -> Response:
        # The release it imitates, as vLLM answers; and, unlike vLLM, what it is: a run's
        # provenance must not say a vLLM served it.
        return JSONResponse(
            {"version": self.settings.vllm_version.text, STANDIN_VERSION_FIELD: __version__}
        )

    async def metrics(self, request: Request) -> Response:
        text = render_metrics(
            self.stats,
            model_name=self.settings.served_model_names[0],
            version=self.settings.vllm_version,
        )
        return Response(text, media_type=METRICS_CONTENT_TYPE)

    async def models(self, request: Request) -> Response:
        if not self._authorized(request):
            return JSONResponse({"error": "Unauthorized"}, status_code=401)
        cards = model_list(
            self.settings.served_model_names,
            root=self.settings.model,
            max_model_len=self.settings.max_model_len,
            created=int(time.time()),
        )
        return JSONResponse(cards)

    async def chat_completions(self, request: Request) -> Response:
        if not self._authorized(request):
            return JSONResponse({"error": "Unauthorized"}, status_code=401)
        try:
            chat = ChatRequest.model_validate(json.loads(await request.body()))
        except (ValueError, ValidationError) as exc:
            message = f"invalid chat completion request: {exc}"
            return self._error(Refusal(400, "BadRequestError", message))
        # In vLLM's order: the request model, the served name, a dead engine, the tool flags,
        # then the context length while the prompt is rendered.
        version = self.settings.vllm_version
        refusal = invalid_request(chat) or unknown_model(
            chat, self.settings.served_model_names, version=version
        )
        if refusal is not None:
            return self._error(refusal)
        if self.engine_dead:
            return self._engine_died()
        prompt_tokens = count_prompt_tokens(chat)
        refusal = tool_choice_refusal(
            chat, auto_tool_choice=self.settings.auto_tool_choice, version=version
        ) or context_refusal(
            chat,
            prompt_tokens=prompt_tokens,
            max_model_len=self.settings.max_model_len,
            version=version,
        )
        if refusal is not None:
            return self._error(refusal)
        plan = plan_completion(
            chat,
            persona=self.settings.persona,
            seed=self.settings.seed,
            latency_ms=self.settings.latency_ms,
            blank_on=self.settings.blank_on,
        )
        async with self.stats.schedule(prompt_tokens) as running:
            if plan.delay_s:
                await asyncio.sleep(plan.delay_s)
            if isinstance(plan.outcome, EngineDeath):
                return self._engine_died()
            if isinstance(plan.outcome, Hang):
                logger.info("persona hang holds the request until the client goes away")
                await self._until_gone(request)
                message = "the server is shutting down"
                return self._error(Refusal(503, "ServiceUnavailableError", message))
            if isinstance(plan.outcome, ServerFault):
                logger.info("persona %s fails this request with 500", self.settings.persona.value)
                message = "stand-in engine error (persona flaky)"
                return self._error(Refusal(500, "InternalServerError", message))
            # The room left in the context; from 0.32 a larger budget is clamped to it (before,
            # context_refusal refused it).
            room, limit = self.settings.max_model_len - prompt_tokens, chat.token_limit
            budget = room if limit is None else min(limit, room)
            reply, finish_reason = truncate(plan.outcome, budget)
            usage = Usage(prompt_tokens, count_completion_tokens(reply))
            # The engine knows only stop and length; "tool_calls" is the API's word.
            running.finish(
                usage.completion_tokens, "length" if finish_reason == "length" else "stop"
            )
        served = chat.model or self.settings.served_model_names[0]
        completion_id = f"chatcmpl-{uuid.uuid4().hex}"
        created = int(time.time())
        if not chat.stream:
            body = completion_body(
                completion_id=completion_id,
                created=created,
                model=served,
                reply=reply,
                finish_reason=reported_finish_reason(
                    chat, reply, finish_reason, version, streamed=False
                ),
                usage=usage,
            )
            return JSONResponse(body)
        bodies = list(
            iter_chunk_bodies(
                completion_id=completion_id,
                created=created,
                model=served,
                reply=reply,
                finish_reason=reported_finish_reason(
                    chat, reply, finish_reason, version, streamed=True
                ),
                usage=usage if chat.include_usage else None,
                lean=version.streams_lean_chunks,
            )
        )

        async def aiter_events() -> AsyncIterator[str]:
            for chunk in bodies:
                yield sse_data(chunk)
            yield sse_data("[DONE]")

        return StreamingResponse(aiter_events(), media_type="text/event-stream")

    def _engine_died(self) -> Response:
        """vLLM's answer once its engine is dead: 500 with an empty body, then shut down.

        Its engine-error handler tells uvicorn to exit, and the server then stops as after
        SIGTERM: in-flight requests end, and the process exits 0 (vLLM issue #48966).
        """
        if not self.engine_dead:
            logger.error("persona dead: the engine died; answering 500 and shutting down")
            self.engine_dead = True
        return Response(status_code=500, background=BackgroundTask(self.stopping.set))

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
    """The ASGI app: ``/health``, ``/version``, ``/metrics``, ``/v1/models``,
    ``/v1/chat/completions``; only ``/v1`` needs the key, as in vLLM.

    Setting *stopping* shuts the server down (persona dead does, once its engine died).
    """
    handlers = _LlmApp(settings, stopping)
    return Starlette(
        routes=[
            Route("/health", handlers.health, methods=["GET"]),
            Route("/version", handlers.version, methods=["GET"]),
            Route("/metrics", handlers.metrics, methods=["GET"]),
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
        "stand-in vLLM %s: model %s, persona %s, seed %d, latency %d ms, auth %s",
        settings.vllm_version.text,
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
