"""``python -m pytest_haico.standins.backend``: a stand-in for the HAI-Co² backend's query API."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import gc
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from psycopg.conninfo import conninfo_to_dict

from pytest_haico.standins.serving import configure_logging, positive_int, run_app

logger = logging.getLogger("pytest_haico.standins.backend")

ADMIN_TOKEN_ENV = "ADMIN_DEFAULT_API_TOKEN"
API_KEY_ENV = "VLLM_API_KEY"
DATABASE_URL_ENV = "HAICO_DATABASE_URL"
# Seconds the start-up waits for the database before giving up: the stack may start the
# backend while its Postgres is still being copied and started (30 s at most).
DATABASE_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class BackendSettings:
    """The stand-in backend's resolved command line and environment."""

    host: str
    port: int
    substitute_model: str | None
    rate_limit_rpm: int | None
    recursion_flag: bool
    admin_token: str
    vllm_api_key: str | None
    database_url: str

    @functools.cached_property
    def secrets(self) -> tuple[str, ...]:
        """Every value that must never reach a log line or an event."""
        password = ""
        with contextlib.suppress(Exception):
            password = str(conninfo_to_dict(self.database_url).get("password") or "")
        values = (self.admin_token, self.vllm_api_key or "", password, self.database_url)
        return tuple(v for v in values if v)


def build_parser() -> argparse.ArgumentParser:
    """The command line; every secret comes from the environment."""
    parser = argparse.ArgumentParser(
        prog="python -m pytest_haico.standins.backend",
        description=f"Stand-in for the HAI-Co² backend. Secrets from the environment only: "
        f"${ADMIN_TOKEN_ENV} (required), ${DATABASE_URL_ENV} (required), ${API_KEY_ENV}.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind, exactly")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument(
        "--substitute-model",
        default=None,
        help="record this model_id in workspace_snapshots instead of the requested one",
    )
    parser.add_argument(
        "--rate-limit-rpm", type=positive_int, default=None, help="answer 429 past N queries/min"
    )
    parser.add_argument(
        "--no-recursion-flag",
        action="store_true",
        help="always send recursion_limit_reached=false (for testing a client's own detection)",
    )
    return parser


def parse_settings(argv: Sequence[str], environ: Mapping[str, str]) -> BackendSettings:
    """Resolve the command line and the environment; exit 2 with a message on a bad value."""
    parser = build_parser()
    args = parser.parse_args(list(argv))
    admin_token = environ.get(ADMIN_TOKEN_ENV, "")
    if not admin_token:
        parser.error(f"${ADMIN_TOKEN_ENV} is not set: the backend refuses to run without one")
    database_url = environ.get(DATABASE_URL_ENV, "")
    if not database_url:
        parser.error(f"${DATABASE_URL_ENV} is not set: give a libpq DSN of the Postgres to use")
    return BackendSettings(
        host=str(args.host),
        port=int(args.port),
        substitute_model=args.substitute_model or None,
        rate_limit_rpm=args.rate_limit_rpm,
        recursion_flag=not args.no_recursion_flag,
        admin_token=admin_token,
        vllm_api_key=environ.get(API_KEY_ENV) or None,
        database_url=database_url,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the stand-in backend until SIGTERM/SIGINT."""
    # No garbage collection while LangGraph, LangChain and the OpenAI SDK import (they make
    # objects, not garbage; the collections cost 15% of the import): the app's start-up
    # freezes what it made and turns the collector back on.
    gc.disable()
    settings = parse_settings(sys.argv[1:] if argv is None else argv, os.environ)
    configure_logging(settings.secrets)
    # Imported only now: LangGraph takes seconds to import, a bad argument should not wait.
    # The database is set up (in a thread) while the rest imports.
    from pytest_haico.standins.snapshots import start_database_setup

    database = start_database_setup(settings.database_url, timeout=DATABASE_TIMEOUT_S)
    from pytest_haico.standins.backend_app import build_app

    logger.info(
        "stand-in backend: substitute model %s, rate limit %s, recursion flag %s",
        settings.substitute_model or "off",
        f"{settings.rate_limit_rpm}/min" if settings.rate_limit_rpm else "off",
        "on" if settings.recursion_flag else "off",
    )
    return run_app(
        build_app(settings, database),
        host=settings.host,
        port=settings.port,
        stopping=asyncio.Event(),
    )


if __name__ == "__main__":
    sys.exit(main())
