"""Dynamic gates of the backend: it answers an authenticated health call, and a canary turn
through it reaches the arm's model and leaves a ``workspace_snapshots`` row naming it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import httpx

from pytest_haico.config.experiment import Arm
from pytest_haico.gates.probes import bearer, get
from pytest_haico.gates.result import GateResult, failed, passed

BACKEND_HEALTH = "backend_health"
CANARY_TURN = "canary_turn"

# The provider the backend records for a turn its vLLM served.
VLLM_PROVIDER = "vllm"
CANARY_ATTEMPTS = 8

# Runs one turn through the backend; returns (provider, model_id) of its workspace_snapshots
# row, or raises when the turn failed.
Canary = Callable[[], Awaitable[tuple[str | None, str | None]]]

_RETRY_PAUSE_S = 0.5
_LOG_FIX = "check the backend's log (runs/<run_id>/logs/)"


async def check_backend_health(
    client: httpx.AsyncClient, backend_url: str, *, token: str, timeout_s: float = 10.0
) -> GateResult:
    """The backend answers an authenticated ``GET /api/health`` with 200."""
    url = f"{backend_url.rstrip('/')}/api/health"
    reply = await get(client, url, headers=bearer(token), timeout_s=timeout_s)
    if reply.status == 200:
        return passed(
            BACKEND_HEALTH,
            f"GET /api/health with the admin token: HTTP 200 in {reply.seconds:.2f} s",
        )
    if reply.status in (401, 403):
        return failed(
            BACKEND_HEALTH,
            f"the backend refused the run's admin token: {reply.describe()}",
            "the token reaches the backend through ADMIN_DEFAULT_API_TOKEN: a backend from "
            f"--haico-backend-cmd or another image must read it; {_LOG_FIX}",
        )
    return failed(
        BACKEND_HEALTH,
        f"GET {url}: {reply.describe()}",
        f"{_LOG_FIX} and its database connection",
    )


async def check_canary_turn(
    canary: Canary,
    *,
    arm: Arm,
    provider: str = VLLM_PROVIDER,
    attempts: int = CANARY_ATTEMPTS,
    timeout_s: float = 180.0,
) -> GateResult:
    """A turn through the backend reaches the arm's model, and its ``workspace_snapshots`` row
    names the provider and model_id the arm expects.

    `canary()` runs one turn and returns the row's (provider, model_id), or raises when the
    turn failed; it must send a new query each call (a seeded flaky model fails the same
    prompt every time). A raise is retried while attempts and `timeout_s` last; running out
    of time is final.
    """
    deadline = time.monotonic() + timeout_s
    failures: list[str] = []
    row: tuple[str | None, str | None] | None = None
    for attempt in range(1, attempts + 1):
        try:
            async with asyncio.timeout(deadline - time.monotonic()):
                row = await canary()
        except TimeoutError:
            failures.append(f"no end of the turn within the canary's {timeout_s:g} s")
            break
        except Exception as exc:
            failures.append(f"{type(exc).__name__}: {exc}")
            if attempt < attempts and deadline - time.monotonic() > _RETRY_PAUSE_S:
                await asyncio.sleep(_RETRY_PAUSE_S)
                continue
        break
    tries = f" (after {len(failures)} failed turn{'s' if len(failures) != 1 else ''})"
    if row is None:
        return failed(
            CANARY_TURN,
            f"no turn through the backend succeeded: {'; '.join(failures[-3:])}",
            f"{_LOG_FIX}: it may not reach the model at the endpoint it was given, or not "
            "write workspace_snapshots",
        )
    got_provider, got_model = row
    note = tries if failures else ""
    if got_provider is None or got_model is None:
        return failed(
            CANARY_TURN,
            f"the canary turn's workspace_snapshots row has provider {got_provider!r} and "
            f"model_id {got_model!r}: which model served a turn cannot be checked{note}",
            "use a backend build that records provider and model_id in workspace_snapshots",
        )
    if (got_provider, got_model) != (provider, arm.served_name):
        return failed(
            CANARY_TURN,
            f"the canary turn was served by provider {got_provider!r}, model {got_model!r}; "
            f"the arm expects {provider!r}, {arm.served_name!r}{note}",
            "the backend did not use the arm's model: check its configuration (no "
            "OPENAI_ENDPOINT_URL, an endpoint host containing 'vllm', the image or "
            "--haico-backend-cmd in use)",
        )
    return passed(CANARY_TURN, f"served by {got_provider!r}, {got_model!r}{note}")
