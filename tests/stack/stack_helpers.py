"""Builders and waits shared by the stack tests (a module, not fixtures)."""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from pytest_haico.stack import HttpService

TINY_SERVICE = Path(__file__).with_name("tiny_service.py")
STACK_OWNER = Path(__file__).with_name("stack_owner.py")


def tiny(
    name: str = "web",
    *,
    mode: str = "ok",
    requires: tuple[str, ...] = (),
    start_timeout: float = 15.0,
    death_signal: signal.Signals | None = signal.SIGKILL,
    token: str | None = None,
    cleanup_paths: tuple[Path, ...] = (),
    argv_hook: Callable[[int], None] | None = None,
) -> HttpService:
    """A tiny_service.py service; `token` goes through its environment and its probe header."""

    def argv(port: int) -> list[str]:
        if argv_hook is not None:
            argv_hook(port)
        return [sys.executable, str(TINY_SERVICE), "--port", str(port), "--mode", mode]

    env: Mapping[str, str] = {"TINY_TOKEN": token} if token else {}
    headers: Mapping[str, str] = {"Authorization": f"Bearer {token}"} if token else {}
    return HttpService(
        name=name,
        argv=argv,
        env=lambda: env,
        health_headers=headers,
        requires=requires,
        start_timeout=start_timeout,
        death_signal=death_signal,
        secrets=(token,) if token else (),
        cleanup_paths=cleanup_paths,
    )


def wait_until(predicate: Callable[[], bool], *, timeout: float, what: str) -> None:
    """Poll `predicate` until it holds; fail naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)
