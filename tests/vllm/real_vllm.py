"""Real ``vllm serve`` from the tier, started for tests: its command, its wait, its stop."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.standins.standin_procs import base_env, free_port
from tests.vllm.setup_tier import SETUP_COMMAND, Manifest, read_manifest, tier_dir

MAX_MODEL_LEN = 2048
# Two started at once were healthy after 134 s, and after 220 s at a load average of 8-11 on
# two cores; the bound is for a machine busier than that.
HEALTHY_WITHIN_S = 600.0
STOP_GRACE_S = 30.0
TOOL_FLAGS = ("--enable-auto-tool-choice", "--tool-call-parser", "hermes")

Popen = subprocess.Popen[bytes]


@dataclass(frozen=True)
class VllmProcess:
    """A running real vLLM: its process, address, log, and how long it took to be healthy."""

    process: Popen
    port: int
    log: Path
    healthy_after_s: float

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def manifest_or_skip() -> Manifest:
    """The tier's manifest; `pytest.skip` naming the set-up command where there is none."""
    manifest = read_manifest()
    if manifest is None:
        pytest.skip(f"the real-vLLM tier is not set up in {tier_dir()}: run `{SETUP_COMMAND}`")
    return manifest


def serve_argv(manifest: Manifest, *, port: int, tools: bool) -> list[str]:
    """The command line: loopback only, one served name, CPU-sized; no secret (the key is in
    ``VLLM_API_KEY``)."""
    argv = [manifest.vllm, "serve", manifest.model, "--served-model-name", manifest.served_name]
    argv += ["--host", "127.0.0.1", "--port", str(port)]
    argv += ["--dtype", "float32", "--max-model-len", str(MAX_MODEL_LEN), "--enforce-eager"]
    return [*argv, *(TOOL_FLAGS if tools else ())]


def serve_environment(manifest: Manifest, *, api_key: str) -> dict[str, str]:
    """This environment without its secrets, the tier's variables, the key, a 1 GiB KV cache."""
    return {
        **base_env(),
        **manifest.environment,
        "VLLM_API_KEY": api_key,
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VIRTUAL_ENV": manifest.venv,
        "PATH": f"{manifest.venv}/bin{os.pathsep}{os.environ.get('PATH', os.defpath)}",
    }


def _tail(log: Path, lines: int = 25) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


def _healthy(port: int) -> bool:
    try:
        response = httpx.get(f"http://127.0.0.1:{port}/health", timeout=2.0, trust_env=False)
    except httpx.HTTPError:
        return False
    return response.status_code == 200


def stop(process: Popen) -> None:
    """SIGTERM to its process group, then SIGKILL of the group after a grace period."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=STOP_GRACE_S)
    # The engine core is a child in the same group; it may outlive the API server.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def spawn(manifest: Manifest, *, log: Path, api_key: str, tools: bool) -> tuple[Popen, int]:
    """Start one vLLM in its own process group, its output in *log*."""
    port = free_port()
    with log.open("wb") as out:
        process = subprocess.Popen(
            serve_argv(manifest, port=port, tools=tools),
            env=serve_environment(manifest, api_key=api_key),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return process, port


def wait_healthy(process: Popen, port: int, *, log: Path, started: float) -> float:
    """Seconds from *started* until ``/health`` answers 200; fails at once if vLLM dies."""
    deadline = started + HEALTHY_WITHIN_S
    while not _healthy(port):
        if process.poll() is not None:
            raise RuntimeError(f"vLLM exited {process.poll()} while starting:\n{_tail(log)}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"vLLM not healthy after {HEALTHY_WITHIN_S:.0f} s:\n{_tail(log)}")
        time.sleep(0.5)
    return time.monotonic() - started


@contextlib.contextmanager
def running_vllms(
    manifest: Manifest, *, log_dir: Path, api_key: str, tool_flags: Sequence[bool]
) -> Iterator[list[VllmProcess]]:
    """Real vLLMs, one per entry of *tool_flags* (with or without the tool flags), started
    together and all stopped at the end, whatever happened."""
    started: list[tuple[Popen, int, Path]] = []
    began = time.monotonic()
    try:
        for tools in tool_flags:
            log = log_dir / f"vllm-{'tools' if tools else 'no-tools'}.log"
            started.append((*spawn(manifest, log=log, api_key=api_key, tools=tools), log))
        servers = [
            VllmProcess(process, port, log, wait_healthy(process, port, log=log, started=began))
            for process, port, log in started
        ]
        yield servers
    finally:
        for process, _, _ in started:
            stop(process)
