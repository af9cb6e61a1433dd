"""A tiny HTTP service for the stack tests, run as a script: healthy, crashing, stuck, stubborn."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--mode", choices=["ok", "exit", "unhealthy", "ignore-term"], default="ok")
    args = parser.parse_args()
    token = os.environ.get("TINY_TOKEN")
    if args.mode == "exit":
        # Prints its token so the tests can check that error messages redact it.
        print(f"tiny_service: refusing to start (mode exit, token {token})", flush=True)
        sys.exit(3)
    if args.mode == "ignore-term":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    healthy = args.mode != "unhealthy"

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            authorised = token is None or self.headers.get("Authorization") == f"Bearer {token}"
            status = 200 if healthy and authorised else 503 if authorised else 401
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            pass  # keep the log to what the tests look for

    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    print(f"tiny_service: listening on {args.port} (mode {args.mode})", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
