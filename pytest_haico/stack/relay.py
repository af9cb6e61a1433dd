"""The model relay: a served model on another node, reached by the backend on this node's
loopback under a name that says `vllm`.

The HAI-Co² backend sends `VLLM_API_KEY` only to an endpoint whose host name contains
`vllm`, so `http://gpu07:8011/v1` would reach a served model (`haico serve`) without its
key. The stack starts this relay instead, on 127.0.0.1, and hands the backend
`http://vllm.localhost:<relay port>/v1`, the name a model started by the run has too (the
cluster profile's hosts file maps it to loopback inside the container). The relay copies
bytes both ways, streamed answers included; it reads nothing, so the key stays between
backend and model.

    python -I relay.py LISTEN_PORT TARGET_HOST TARGET_PORT

is run by path, so that it imports nothing of pytest-haico (the standard library only).
"""

from __future__ import annotations

import asyncio
import signal
import sys
from functools import partial
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pytest_haico.stack.profiles import HttpService

RELAY = "model-relay"
_CHUNK = 1 << 16


def build_relay_service(host: str, port: int) -> HttpService:
    """The relay to `host:port` as a stack service, healthy once the model's /health answers
    through it (which vLLM answers without the key)."""
    from pytest_haico.stack.profiles import HttpService  # the relay itself runs without it

    return HttpService(
        name=RELAY,
        # -I: nothing of the environment, nor this folder on the module path.
        argv=lambda listen: [sys.executable, "-I", __file__, str(listen), host, str(port)],
        health_path="/health",
    )


async def _copy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy until the reader's end, then pass the end on (a half-close where possible)."""
    try:
        while data := await reader.read(_CHUNK):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except OSError:
        writer.close()


async def _relay(
    host: str, port: int, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter
) -> None:
    try:
        model_r, model_w = await asyncio.open_connection(host, port)
    except OSError as exc:
        print(f"{RELAY}: cannot reach {host}:{port}: {exc}", file=sys.stderr, flush=True)
        client_w.close()
        return
    try:
        await asyncio.gather(_copy(client_r, model_w), _copy(model_r, client_w))
    finally:
        client_w.close()
        model_w.close()


async def serve(listen_port: int, host: str, port: int) -> None:
    """Relay 127.0.0.1:`listen_port` to `host:port` until TERM or INT."""
    server = await asyncio.start_server(partial(_relay, host, port), "127.0.0.1", listen_port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"{RELAY}: 127.0.0.1:{listen_port} -> {host}:{port}", flush=True)
    async with server:
        await stop.wait()


def main(argv: list[str]) -> int:
    listen_port, host, port = argv
    try:
        asyncio.run(serve(int(listen_port), host, int(port)))
    except OSError as exc:  # "address already in use": the stack retries on another port
        print(f"{RELAY}: {exc}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
