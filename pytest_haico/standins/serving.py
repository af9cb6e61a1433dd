"""Running a stand-in's ASGI app: exact bind, redacted logs on stderr, clean exit on signals."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Generator, Iterable
from types import FrameType

import uvicorn
from starlette.types import ASGIApp

from pytest_haico.redact import Redactor

# Seconds that in-flight requests get after SIGTERM/SIGINT before they are cancelled; the
# stack's own stop waits longer than this before it escalates to SIGKILL.
GRACE_S = 3

logger = logging.getLogger(__name__)


class _StandinServer(uvicorn.Server):
    """uvicorn's server, but a signal also wakes the app's waiters and the exit code stays 0;
    the app can stop it too, by setting the same event."""

    def __init__(self, config: uvicorn.Config, stopping: asyncio.Event) -> None:
        super().__init__(config)
        self._stopping = stopping

    async def on_tick(self, counter: int) -> bool:
        # Checked every 0.1 s: a graceful shutdown, exactly as after SIGTERM.
        if self._stopping.is_set():
            self.should_exit = True
        return await super().on_tick(counter)

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        # uvicorn re-raises the captured signal after a graceful stop, which turns a clean
        # SIGTERM shutdown into death by signal; a stand-in that stopped cleanly exits 0.
        loop = asyncio.get_running_loop()

        def on_signal(signum: int, frame: FrameType | None) -> None:
            if not self.started:
                # Still starting (the backend waits up to a minute for its database, which
                # the same stop may be taking down), so nothing to drain: end at once.
                logger.info("stopped by %s while starting", signal.Signals(signum).name)
                os._exit(0)
            if self.should_exit and signum == signal.SIGINT:
                self.force_exit = True  # a second Ctrl-C skips the grace period, as in uvicorn
            self.should_exit = True
            loop.call_soon_threadsafe(self._stopping.set)

        previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


class RedactingFormatter(logging.Formatter):
    """A log formatter that passes the finished line, traceback included, through a redactor."""

    def __init__(self, redactor: Redactor) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")
        self._redactor = redactor

    def format(self, record: logging.LogRecord) -> str:
        return self._redactor.redact(super().format(record))


def configure_logging(secrets: Iterable[str]) -> None:
    """Send every log record (uvicorn's included) to stderr, with the secrets masked."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(RedactingFormatter(Redactor(secrets)))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)


def run_app(app: ASGIApp, *, host: str, port: int, stopping: asyncio.Event) -> int:
    """Serve *app* on exactly *host*:*port* until SIGTERM/SIGINT; return the exit code.

    *stopping* is set when the signal arrives, so requests that would otherwise wait forever
    (a hanging model, a long turn) can end before the grace period runs out; the app may set
    it itself to shut the server down the same way. Call `configure_logging` first:
    uvicorn's records go through the same redacting handler.
    """
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        # Named, not "auto" (which falls back to asyncio and h11 in silence): the stand-ins'
        # extra installs both, and their CPU per request is what the benchmarks measure.
        loop="uvloop",
        http="httptools",
        log_config=None,
        log_level="info",
        lifespan="on",
        timeout_graceful_shutdown=GRACE_S,
    )
    _StandinServer(config, stopping).run()
    return 0


def positive_int(text: str) -> int:
    """An argparse type: an integer of 1 or more."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, got {value}")
    return value
