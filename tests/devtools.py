"""Headless Chromium driven over its DevTools protocol, for tests that act on a page as a
user does: `--remote-debugging-pipe` (Chromium reads commands on fd 3 and writes answers and
events on fd 4, each a JSON message ended by a NUL byte). Every read has a deadline."""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import Any

# Puts the pipe's two ends at Chromium's fds 3 and 4 (closing the numbers they had), then
# becomes Chromium.
_AT_3_AND_4 = """
import os, sys
for end, fd in ((int(sys.argv[1]), 3), (int(sys.argv[2]), 4)):
    os.dup2(end, fd)
    os.close(end)
os.execv(sys.argv[3], sys.argv[3:])
"""
KEYS = {"ArrowUp": 38, "ArrowDown": 40, "Enter": 13}  # their Windows virtual key codes
TIMEOUT_S = 60.0  # a bound on any one answer or condition, far beyond what a page takes


class DevToolsError(RuntimeError):
    """Chromium answered a command with an error, ended, or took longer than the bound."""


class Browser:
    """One headless Chromium with one page, attached to over the pipe (`Browser(...).open`)."""

    def __init__(self, chromium: str, profile: Path, *, env: dict[str, str]) -> None:
        commands_read, self._commands = _pipe()  # Chromium's fd 3
        self._answers, answers_write = _pipe()  # Chromium's fd 4
        try:
            self._process = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    _AT_3_AND_4,
                    str(commands_read),
                    str(answers_write),
                    chromium,
                    "--headless",
                    "--no-sandbox",
                    "--disable-gpu",
                    "--remote-debugging-pipe",
                    f"--user-data-dir={profile}",
                    "about:blank",
                ],
                pass_fds=(commands_read, answers_write),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                env=env,
            )
        finally:
            os.close(commands_read)
            os.close(answers_write)
        self._ids = itertools.count(1)
        self._buffer = b""
        self._session: str | None = None

    def __enter__(self) -> Browser:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Ask Chromium to end; kill it if it has not ended within the bound."""
        with contextlib.suppress(OSError):  # it has ended already
            self._send({"id": next(self._ids), "method": "Browser.close"})
        try:
            self._process.wait(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait(timeout=TIMEOUT_S)
        finally:
            os.close(self._commands)
            os.close(self._answers)

    def open(self, url: str) -> None:
        """Open `url` in a new page, attach to it, and wait for it to have loaded."""
        target = self.command("Target.createTarget", url=url, session=False)["targetId"]
        attached = self.command(
            "Target.attachToTarget", targetId=target, flatten=True, session=False
        )
        self._session = attached["sessionId"]
        loaded = f"location.href === {json.dumps(url)} && document.readyState === 'complete'"
        self.wait_for(loaded, what=f"{url} loaded")

    def command(self, method: str, *, session: bool = True, **params: Any) -> dict[str, Any]:
        """Send one command (to the page unless `session` is off) and return its result."""
        message: dict[str, Any] = {"id": next(self._ids), "method": method, "params": params}
        if session:
            message["sessionId"] = self._session
        self._send(message)
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            answer = self._receive(deadline, what=method)
            if answer.get("id") != message["id"]:
                continue  # an event, or the answer to another command
            if "error" in answer:
                raise DevToolsError(f"{method}: {answer['error']}")
            result: dict[str, Any] = answer.get("result", {})
            return result

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page."""
        result = self.command("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise DevToolsError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, *, what: str) -> None:
        """Until the expression is true in the page; `DevToolsError` past the bound."""
        deadline = time.monotonic() + TIMEOUT_S
        while not self.evaluate(expression):
            if time.monotonic() > deadline:
                raise DevToolsError(f"{what}: not within {TIMEOUT_S:g} s")
            time.sleep(0.05)

    def click(self, selector: str) -> None:
        """Scroll the element into view, then press and release the left mouse button at
        its centre."""
        box = self.evaluate(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)}); "
            "e.scrollIntoView({block: 'center'}); const r = e.getBoundingClientRect(); "
            "return [r.x + r.width / 2, r.y + r.height / 2]; })()"
        )
        for kind in ("mousePressed", "mouseReleased"):
            self.command(
                "Input.dispatchMouseEvent",
                type=kind,
                x=box[0],
                y=box[1],
                button="left",
                clickCount=1,
            )

    def press(self, key: str) -> None:
        """Press and release a key that types nothing (`KEYS`) where the focus is."""
        code = KEYS[key]
        for kind in ("rawKeyDown", "keyUp"):
            self.command(
                "Input.dispatchKeyEvent",
                type=kind,
                key=key,
                code=key,
                windowsVirtualKeyCode=code,
                nativeVirtualKeyCode=code,
            )

    def choose(self, selector: str, value: str) -> None:
        """Choose the option `value` of a <select> as a user does: click it (its list
        opens), arrow keys to the option, Enter; the page gets a real `change` event."""
        element = f"document.querySelector({json.dumps(selector)})"
        options = self.evaluate(f"[...{element}.options].map(o => o.value)")
        moves = options.index(value) - self.evaluate(f"{element}.selectedIndex")
        self.click(selector)
        for _ in range(abs(moves)):
            self.press("ArrowDown" if moves > 0 else "ArrowUp")
        self.press("Enter")

    def _send(self, message: dict[str, Any]) -> None:
        data = json.dumps(message).encode() + b"\0"
        while data:
            data = data[os.write(self._commands, data) :]

    def _receive(self, deadline: float, *, what: str) -> dict[str, Any]:
        """The next message Chromium sends, within the deadline."""
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise DevToolsError(f"{what}: no answer within {TIMEOUT_S:g} s")
            ready, _, _ = select.select([self._answers], [], [], left)
            if not ready:
                continue
            chunk = os.read(self._answers, 1 << 16)
            if not chunk:
                raise DevToolsError(f"{what}: Chromium ended (exit {self._process.poll()})")
            self._buffer += chunk
        message, _, self._buffer = self._buffer.partition(b"\0")
        answer: dict[str, Any] = json.loads(message)
        return answer


def _pipe() -> tuple[int, int]:
    """A pipe whose two ends are numbered 10 or above, clear of the 3 and 4 they become."""
    read, write = os.pipe()
    try:
        return _above_9(read), _above_9(write)
    finally:
        os.close(read)
        os.close(write)


def _above_9(fd: int) -> int:
    return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
