"""The HTTP exchanges of the dynamic gates: bounded in time, retried on 5xx where a gate
allows it, and vLLM's error bodies read in both of their shapes (notes/vllm.md)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import httpx

_BODY_CHARS = 300
_FIRST_BACKOFF_S = 0.1
_MAX_BACKOFF_S = 1.0


@dataclass(frozen=True)
class Reply:
    """The last answer to a probe (`status` None: none came), and what retried attempts got."""

    status: int | None
    body: Any  # the decoded JSON, None when the body is not JSON
    text: str
    problem: str | None = None  # why there was no answer
    retried: tuple[str, ...] = ()
    seconds: float = 0.0

    @property
    def message(self) -> str:
        """The error message of the body, or the transport problem."""
        if self.status is None:
            return self.problem or "no answer"
        return error_message(self.body, self.text)

    def describe(self) -> str:
        """``HTTP 400: <message>``, or the transport problem; earlier attempts appended."""
        if self.status is None:
            shown = self.problem or "no answer"
        elif 200 <= self.status < 300:
            shown = f"HTTP {self.status}"
        else:
            shown = f"HTTP {self.status}: {self.message}"
        return shown + self.retried_note()

    def retried_note(self) -> str:
        """`` (after 2 retries: HTTP 500, HTTP 500)`` or nothing."""
        if not self.retried:
            return ""
        count = len(self.retried)
        return f" (after {count} retr{'ies' if count != 1 else 'y'}: {', '.join(self.retried)})"


def error_message(body: Any, text: str) -> str:
    """The message of an error body: vLLM <= 0.10.0 flat ``{"message"}``, >= 0.10.1 nested
    ``{"error": {"message"}}``, a 401's ``{"error": "Unauthorized"}``, a web framework's
    ``{"detail"}``; else the text's start."""
    if isinstance(body, dict):
        flat = body.get("message")
        if isinstance(flat, str):
            return flat
        error = body.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])
        if isinstance(error, str):
            return error
        detail = body.get("detail")
        if isinstance(detail, str):
            return detail
    stripped = " ".join(text.split())
    return stripped[:_BODY_CHARS] if stripped else "(empty body)"


def bearer(token: str) -> dict[str, str]:
    """The Authorization header for `token`; none for no token ("Bearer " alone is no valid
    header: h11 refuses to send it)."""
    return {"Authorization": f"Bearer {token}"} if token else {}


async def get(
    client: httpx.AsyncClient, url: str, *, headers: Mapping[str, str], timeout_s: float
) -> Reply:
    """One GET, answered or given up within `timeout_s`."""
    started = time.monotonic()
    reply = await _exchange(client, "GET", url, headers=headers, body=None, timeout_s=timeout_s)
    return _timed(reply, started)


async def post(
    client: httpx.AsyncClient,
    url: str,
    *,
    headers: Mapping[str, str],
    body_for: Callable[[int], dict[str, Any]],
    attempts: int,
    timeout_s: float,
) -> Reply:
    """POST ``body_for(k)`` for attempt k = 1, 2, ...: again after a 5xx, while attempts and
    the `timeout_s` budget last. A refused connection or a timeout is final."""
    started = time.monotonic()
    deadline = started + timeout_s
    retried: list[str] = []
    backoff = _FIRST_BACKOFF_S
    for attempt in range(1, attempts + 1):
        remaining = deadline - time.monotonic()
        reply = await _exchange(
            client, "POST", url, headers=headers, body=body_for(attempt), timeout_s=remaining
        )
        if reply.status is None or reply.status < 500 or attempt == attempts:
            break
        if deadline - time.monotonic() <= backoff:
            break
        retried.append(_short(reply))
        await asyncio.sleep(backoff)
        backoff = min(backoff * 2, _MAX_BACKOFF_S)
    return _timed(replace(reply, retried=tuple(retried)), started)


def _short(reply: Reply) -> str:
    if reply.status is None:
        return reply.problem or "no answer"
    message = reply.message
    return f"HTTP {reply.status}" + (f" {message[:60]!r}" if message != "(empty body)" else "")


def _timed(reply: Reply, started: float) -> Reply:
    return replace(reply, seconds=time.monotonic() - started)


async def _exchange(
    client: httpx.AsyncClient,
    method: str,
    url: str,
    *,
    headers: Mapping[str, str],
    body: dict[str, Any] | None,
    timeout_s: float,
) -> Reply:
    if timeout_s <= 0:
        return Reply(None, None, "", problem=f"{method} {url}: no time left")
    try:
        async with asyncio.timeout(timeout_s):
            response = await client.request(
                method, url, headers=dict(headers), json=body, timeout=httpx.Timeout(timeout_s)
            )
    except (TimeoutError, httpx.TimeoutException):
        return Reply(None, None, "", problem=f"{method} {url}: no answer within {timeout_s:.3g} s")
    except httpx.HTTPError as exc:
        text = str(exc)
        kind = type(exc).__name__
        return Reply(None, None, "", problem=f"{method} {url}: {kind}{': ' + text if text else ''}")
    try:
        decoded: Any = response.json()
    except ValueError:
        decoded = None
    return Reply(response.status_code, decoded, response.text)
