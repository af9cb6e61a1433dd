"""The supervisor of a kept stack: `haico stack up` starts it as
`python -m pytest_haico.kept.supervisor` in a session of its own, with its request (no
secret) on stdin and its log as stderr.

It starts the arm's stack (every service its child, with a parent-death signal: a
`kill -9` of the supervisor takes them along), runs the periodic dumps, writes the state
file and answers one JSON line on stdout. Then it waits: for SIGTERM, SIGINT or SIGHUP
(`haico stack down`, Slurm ending the allocation), for a service to die, or for its
allocation to end. At the end: the final dump while Postgres is up, every service
stopped, the state file removed.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

from pytest_haico.config.cluster_env import ClusterEnv, load_cluster_env
from pytest_haico.config.experiment import Arm, load_arm
from pytest_haico.config.settings import Profile
from pytest_haico.errors import DumpError, HaicoError
from pytest_haico.procfs import read_proc_stat
from pytest_haico.provenance.dumps import DatabaseDumps
from pytest_haico.redact import Redactor
from pytest_haico.slurm.jobs import job_has_ended
from pytest_haico.stack.arm_stack import build_arm_stack
from pytest_haico.stack.kept import KeptService, KeptState, serves, write_state
from pytest_haico.stack.profiles import HttpService, Stack
from pytest_haico.stack.request import BackendCommand, StackRequest
from pytest_haico.stamps import utc_iso

_log = logging.getLogger("haico.supervisor")
# How often the supervisor looks at its services, and at its allocation.
POLL_S = 0.5
ALLOCATION_POLL_S = 10.0


def main() -> int:
    logging.basicConfig(
        stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(name)s: %(message)s"
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per health probe
    request: dict[str, Any] = json.loads(sys.stdin.read())
    stop = threading.Event()
    stack: Stack | None = None

    def on_signal(signum: int, frame: object) -> None:
        name = signal.Signals(signum).name
        _log.info("%s: stopping", name)
        stop.set()
        if stack is not None:
            stack.interrupt(f"{name} while the kept stack was starting")

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)
    began = time.monotonic()
    try:
        arm = load_arm(Path(request["arm_file"]))
        cluster_env = request.get("cluster_env")
        site = load_cluster_env(Path(cluster_env)) if cluster_env else None
        stack = _build(request, arm, site)
        if stop.is_set():  # a signal came before the stack could take it
            stack.interrupt("a signal while the kept stack was being built")
        stack.start()
    except Exception as exc:  # leak-proof start: what started is stopped already
        secrets = stack.secrets if stack is not None else ()
        what = str(exc) if isinstance(exc, HaicoError) else f"{type(exc).__name__}: {exc}"
        error = Redactor(secrets).redact(what)
        _log.error("the stack did not start: %s", error)
        _answer({"error": error})
        return 1
    redactor = Redactor(stack.secrets)
    directory = Path(request["directory"])
    state_path = Path(request["state_path"])
    dumps = DatabaseDumps(
        stack.postgres,
        directory / "dumps",
        interval_s=float(request["dump_interval_s"]),
        file_mode=int(request["file_mode"]),
    )
    try:
        dumps.start_periodic()
        state = _state(request, stack, arm, site)
        write_state(state_path, state)
        _log.info("healthy in %.1f s; state file %s", time.monotonic() - began, state_path)
        _answer({"state": str(state_path), "seconds": time.monotonic() - began})
        reason = _wait(stop, stack, request.get("allocation"))
        _log.info("stopping: %s", redactor.redact(reason))
    finally:
        with contextlib.suppress(FileNotFoundError):
            state_path.unlink()
        _stop(stack, dumps)
    return 0


def _build(request: dict[str, Any], arm: Arm, site: ClusterEnv | None) -> Stack:
    command = request.get("backend_command")
    backend_command = BackendCommand(command, Path(request["backend_dir"])) if command else None
    return build_arm_stack(
        StackRequest(
            arm=arm,
            run_dir=Path(request["directory"]),
            profile=Profile(request["profile"]),
            site=site,
            backend_image=request.get("backend_image"),
            backend_command=backend_command,
            log_mode=int(request["file_mode"]),
        )
    )


def _state(request: dict[str, Any], stack: Stack, arm: Arm, site: ClusterEnv | None) -> KeptState:
    profile = Profile(request["profile"])
    served = serves(
        arm,
        profile,
        backend_image=request.get("backend_image"),
        site_image=site.get("BACKEND_IMAGE") if site is not None else None,
    )
    services = []
    for service in stack.orchestrator.services:
        process = stack.processes[service.name]
        assert process.pid is not None and process.start_time is not None
        health = None
        if isinstance(service, HttpService):
            health = f"http://127.0.0.1:{process.port}{service.health_path}"
        services.append(
            KeptService(
                name=service.name,
                pid=process.pid,
                start_time=process.start_time,
                port=process.port,
                log_path=str(stack.log_paths[service.name]),
                health_url=health,
                health_auth=bool(isinstance(service, HttpService) and service.health_headers),
                ready_s=stack.timings[service.name].ready,
            )
        )
    me = read_proc_stat(os.getpid())
    assert me is not None
    return KeptState(
        arm=arm.name,
        arm_file=request["arm_file"],
        profile=profile.value,
        serves=served,
        backend_command=request.get("backend_command"),
        supervisor_pid=os.getpid(),
        supervisor_start_time=me.start_time,
        host=socket.gethostname(),
        started_at=utc_iso(),
        allocation=request.get("allocation"),
        directory=request["directory"],
        dump_interval_s=float(request["dump_interval_s"]),
        services=tuple(services),
        backend_url=stack.backend_url,
        llm_url=stack.llm_url,
        model_endpoint=stack.model_endpoint,
        postgres_version=stack.postgres_version,
        api_key=stack.api_key,
        admin_token=stack.admin_token,
        readonly_dsn=stack.readonly_dsn,
        secrets=stack.secrets,
    )


def _wait(stop: threading.Event, stack: Stack, allocation: str | None) -> str:
    """Until a signal, a service's death or the allocation's end; returns which."""
    next_allocation_check = time.monotonic() + ALLOCATION_POLL_S
    while not stop.wait(POLL_S):
        for name, process in stack.processes.items():
            status = process.exit_status()
            if status is not None:
                return f"{name} (pid {process.pid}) ended with status {status}"
        if allocation and time.monotonic() >= next_allocation_check:
            next_allocation_check = time.monotonic() + ALLOCATION_POLL_S
            if job_has_ended(allocation):
                return f"allocation {allocation} has ended"
    return "a signal"


def _stop(stack: Stack, dumps: DatabaseDumps) -> None:
    """The final dump while Postgres is up, then every service."""
    dumps.stop_periodic()
    postgres = stack.processes.get("postgres")
    try:
        if postgres is not None and postgres.exit_status() is None:
            path = dumps.dump("final")
            _log.info("final dump %s", path)
        else:
            _log.warning("no final dump: postgres had ended")
    except DumpError as exc:
        _log.warning("the final dump failed: %s", exc)
    finally:
        stack.stop()
        _log.info("every service stopped")


def _answer(message: dict[str, Any]) -> None:
    """The one line `haico stack up` waits for; stdout is closed after it."""
    with contextlib.suppress(OSError):
        sys.stdout.write(json.dumps(message) + "\n")
        sys.stdout.flush()
        sys.stdout.close()


if __name__ == "__main__":
    sys.exit(main())
