"""A service for the start-wait tests, run as a script: it "loads" (a log line every --every
seconds, --lines of them), then listens, hangs without a word, or exits 1."""

from __future__ import annotations

import argparse
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Healthy(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass  # the log is the loading lines only


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--lines", type=int, required=True)
    parser.add_argument("--every", type=float, required=True)
    parser.add_argument("--then", choices=["listen", "hang", "exit"], required=True)
    args = parser.parse_args()
    for line in range(1, args.lines + 1):
        print(f"loading: step {line} of {args.lines}", flush=True)
        time.sleep(args.every)
    if args.then == "exit":
        print("RuntimeError: out of memory while loading", flush=True)
        sys.exit(1)
    if args.then == "hang":
        while True:
            time.sleep(3600)
    ThreadingHTTPServer(("127.0.0.1", args.port), Healthy).serve_forever()


if __name__ == "__main__":
    main()
