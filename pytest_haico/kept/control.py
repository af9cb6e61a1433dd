"""`haico stack up|status|down`: an arm's stack kept up between pytest runs in an `salloc`
shell (`pytest --haico-attach <state file>` uses it), under a supervisor that dies with the
allocation or at `down`."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

import httpx
from filelock import FileLock, Timeout

from pytest_haico import httpclient
from pytest_haico.config.experiment import Arm, load_arm
from pytest_haico.config.resolution import DEFAULT_CAMPAIGN
from pytest_haico.config.settings import Profile
from pytest_haico.durations import format_duration
from pytest_haico.errors import HaicoError, StackError
from pytest_haico.files import make_dirs, open_for_append, shown_path
from pytest_haico.stack.kept import (
    KeptService,
    KeptState,
    read_state,
    stacks_dir,
    state_path,
)
from pytest_haico.stamps import utc_name

Say = Callable[[str], None]
# The logger whose lines of the supervisor's log `up` shows: each service spawned, waited
# for, healthy.
SERVICE_LOGGER = "pytest_haico.stack.service"
# How long `down` waits for the supervisor's final dump and stop before it kills it.
DOWN_TIMEOUT_S = 300.0


class KeptStackError(HaicoError):
    """A kept stack that cannot be started, found or stopped as asked."""


def up(
    arm_name: str,
    *,
    experiments: Path,
    profile: Profile,
    cluster_env: Path | None,
    campaign_dir: Path,
    backend_command: str | None,
    backend_image: str | None,
    dump_interval_s: float,
    file_mode: int,
    say: Say,
) -> int:
    """Start the supervisor of `arm_name`'s stack and wait until the stack is healthy."""
    arm_file = experiments / "arms" / f"{arm_name}.toml"
    if not arm_file.is_file():
        known = sorted(p.stem for p in (experiments / "arms").glob("*.toml"))
        raise KeptStackError(
            f"{arm_file}: no such arm file; the arms under {experiments}: "
            f"{', '.join(known) or 'none'}"
        )
    arm = load_arm(arm_file)
    allocation = os.environ.get("SLURM_JOB_ID")
    if profile is Profile.CLUSTER and not allocation:
        raise KeptStackError(
            "the cluster profile's stack runs inside an allocation: run `haico stack up` in "
            "an salloc shell on the allocated node (or use --profile local)"
        )
    if backend_image is not None and profile is not Profile.CLUSTER:
        raise KeptStackError(
            "--backend-image runs the backend from an image, which only the cluster profile "
            "does: add --profile cluster, or run a local build with --backend-cmd CMD"
        )
    path = state_path(arm.name)
    lock = FileLock(path.with_suffix(".lock"))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        raise KeptStackError(
            f"another `haico stack up {arm.name}` is starting the stack of arm {arm.name}: "
            "wait for it, then attach to its stack"
        ) from None
    try:
        return _start_supervisor(
            arm,
            path,
            profile,
            campaign_dir,
            say,
            request={
                "arm_file": str(arm_file.resolve()),
                "profile": profile.value,
                "cluster_env": str(cluster_env) if cluster_env is not None else None,
                "backend_command": backend_command,
                "backend_image": backend_image,
                "backend_dir": os.getcwd(),
                "state_path": str(path),
                "dump_interval_s": dump_interval_s,
                "file_mode": file_mode,
                "allocation": allocation,
            },
        )
    finally:
        lock.release()


def _start_supervisor(
    arm: Arm,
    path: Path,
    profile: Profile,
    campaign_dir: Path,
    say: Say,
    *,
    request: dict[str, Any],
) -> int:
    """Start the supervisor with `request` and wait for its answer (under the arm's lock)."""
    _refuse_a_second(path)
    stamp = utc_name()
    directory = campaign_dir / arm.name / "kept" / f"{stamp}-{os.getpid()}"
    make_dirs(directory, request["file_mode"])
    log = directory / "supervisor.log"
    request["directory"] = str(directory)
    say(
        f"haico: starting the stack of arm {arm.name} ({profile.value} profile); log: "
        f"{shown_path(log)}"
    )
    with os.fdopen(open_for_append(log, mode=request["file_mode"]), "ab") as stderr:
        supervisor = subprocess.Popen(
            [sys.executable, "-m", "pytest_haico.kept.supervisor"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            start_new_session=True,  # a Ctrl-C in the shell is not meant for it
        )
    assert supervisor.stdin is not None and supervisor.stdout is not None
    try:
        supervisor.stdin.write(json.dumps(request).encode())
        supervisor.stdin.close()
        line = _answer(supervisor.stdout, log, say)
    except KeyboardInterrupt:
        supervisor.terminate()
        supervisor.wait()
        raise
    answer = json.loads(line) if line.strip() else {}
    if "state" not in answer:
        supervisor.wait()
        why = answer.get("error") or f"the supervisor ended (status {supervisor.returncode})"
        raise KeptStackError(f"the stack of arm {arm.name} did not start: {why}; log: {log}")
    state = read_state(path)
    say(
        f"haico: {arm.name} stack up in {answer['seconds']:.1f} s: "
        + ", ".join(f"{s.name} :{s.port}" for s in state.services)
        + f"; supervisor pid {state.supervisor_pid}"
    )
    say(f"haico: state file {shown_path(path)}")
    campaign = campaign_dir.name
    also = f" --haico-campaign {campaign}" if campaign != DEFAULT_CAMPAIGN else ""
    say(f"haico: next: pytest experiments --haico-attach {path}{also}")
    return 0


def _answer(answers: IO[bytes], log: Path, say: Say) -> bytes:
    """The supervisor's one line; meanwhile the services' start-up as its log tells it
    (a model that loads for minutes says where it is every 30 s)."""
    told = 0
    while True:
        ready, _, _ = select.select([answers], [], [], 1.0)
        with contextlib.suppress(OSError), log.open("rb") as handle:
            handle.seek(told)
            new = handle.read()
            complete = new[: new.rfind(b"\n") + 1]
            told += len(complete)
            for entry in complete.decode(errors="replace").splitlines():
                _, _, message = entry.partition(f" {SERVICE_LOGGER}: ")
                if message:
                    say(f"haico:   {message}")
        if ready:
            return answers.readline()


def _refuse_a_second(path: Path) -> None:
    """One kept stack per arm and user on a node; a state file left by a stack that is gone
    is removed."""
    if not path.exists():
        return
    try:
        state = read_state(path)
    except StackError as exc:
        if "is gone" not in str(exc):
            raise
        path.unlink()
        return
    raise KeptStackError(
        f"the stack of arm {state.arm} is already kept up (supervisor pid "
        f"{state.supervisor_pid}, since {state.started_at}; state file {path}): attach to it, "
        f"or `haico stack down {state.arm}` first"
    )


def status(target: str | None, *, say: Say) -> int:
    """What runs, since when, on which ports, with which arm settings, and how healthy:
    exit 1 when a service is not (or, listing them all, a stack is gone)."""
    if target is None:
        paths = sorted(stacks_dir().glob("*.json"))
        if not paths:
            say(f"haico: no stack kept up (none in {stacks_dir()})")
            return 0
    else:
        paths = [_resolve(target)]
    unhealthy = False
    for path in paths:
        if target is None:  # one stack that is gone or not ours does not hide the others
            try:
                state = read_state(path)
            except StackError as exc:
                say(f"haico: {exc}")
                unhealthy = True
                continue
        else:
            state = read_state(path)
        for line in _status_lines(path, state):
            unhealthy |= line.endswith("NOT HEALTHY")
            say(line)
    return 1 if unhealthy else 0


def _status_lines(path: Path, state: KeptState) -> Iterator[str]:
    since = datetime.fromisoformat(state.started_at)
    age = (datetime.now(UTC) - since).total_seconds()
    where = f"allocation {state.allocation}" if state.allocation else "no allocation"
    yield (
        f"{state.arm}: {state.profile} profile, up since {state.started_at} "
        f"({format_duration(age)}), supervisor pid {state.supervisor_pid} on {state.host}, {where}"
    )
    yield f"  state file: {path}"
    dumps = sorted((Path(state.directory) / "dumps").glob("*.dump"))
    newest = f", newest {dumps[-1].name}" if dumps else ""
    every = format_duration(state.dump_interval_s) if state.dump_interval_s > 0 else None
    yield (
        f"  logs and dumps: {state.directory} ({len(dumps)} dump(s){newest}; "
        + (f"every {every})" if every else "only the final one, at down)")
    )
    yield f"  arm file: {state.arm_file}"
    for section, values in sorted(state.serves.items()):
        shown = " ".join(
            f"{k}={json.dumps(v)}" for k, v in sorted(values.items()) if v not in (None, [])
        )
        if shown:
            yield f"  serves {section}: {shown}"
    if state.backend_command:
        yield f"  backend command: {state.backend_command}"
    width = max(len(s.name) for s in state.services)
    for service in state.services:
        yield (
            f"  {service.name:<{width}}  pid {service.pid:<7} port {service.port:<5}  "
            f"{_health(service, state)}"
        )


def _health(service: KeptService, state: KeptState) -> str:
    if not service.alive():
        return "ended: NOT HEALTHY"
    began = time.monotonic()
    if service.health_url is None:
        try:
            with socket.create_connection(("127.0.0.1", service.port), timeout=2.0):
                pass
        except OSError as exc:
            return f"port refuses connections ({exc.strerror}): NOT HEALTHY"
        return f"healthy (accepts connections, {_ms(began)})"
    headers = {"Authorization": f"Bearer {state.admin_token}"} if service.health_auth else {}
    try:
        response = httpclient.get(service.health_url, headers=headers, timeout=2.0)
    except httpx.HTTPError as exc:
        return f"GET {service.health_url}: {type(exc).__name__}: NOT HEALTHY"
    if not response.is_success:
        return f"GET {service.health_url}: {response.status_code}: NOT HEALTHY"
    return f"healthy (GET {service.health_url} {response.status_code}, {_ms(began)})"


def down(target: str, *, say: Say) -> int:
    """Stop the kept stack: the supervisor writes the final dump and stops every service."""
    path = _resolve(target)
    try:
        state = read_state(path)
    except StackError as exc:
        if "is gone" in str(exc):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            raise KeptStackError(f"{exc} (its state file is removed)") from None
        raise
    began = time.monotonic()
    say(f"haico: stopping the stack of arm {state.arm} (supervisor pid {state.supervisor_pid})")
    _signal(state, signal.SIGTERM)
    deadline = began + DOWN_TIMEOUT_S
    while state.supervisor_alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    if state.supervisor_alive():  # its services die with it (a parent-death signal)
        _signal(state, signal.SIGKILL)
        say(f"haico: the supervisor did not stop within {DOWN_TIMEOUT_S:.0f} s: killed")
    for service in state.services:
        deadline = time.monotonic() + 10
        while service.alive() and time.monotonic() < deadline:
            time.sleep(0.05)
    left = [f"{s.name} (pid {s.pid})" for s in state.services if s.alive()]
    if left:
        raise KeptStackError(f"still running after the stop: {', '.join(left)}")
    final = sorted((Path(state.directory) / "dumps").glob("final-*.dump"))
    dump = f"final dump {shown_path(final[-1])}" if final else "NO final dump (see supervisor.log)"
    up_s = (datetime.now(UTC) - datetime.fromisoformat(state.started_at)).total_seconds()
    say(
        f"haico: {state.arm} stack down in {time.monotonic() - began:.1f} s after "
        f"{format_duration(up_s)} up; {dump}; no process left"
    )
    return 0 if final else 1


def _signal(state: KeptState, sig: signal.Signals) -> None:
    """Signal the supervisor if it is still the process the state file names."""
    if state.supervisor_alive():
        with contextlib.suppress(ProcessLookupError):
            os.kill(state.supervisor_pid, sig)


def _resolve(target: str) -> Path:
    """A state file's path, or an arm's name (its state file in the stacks' directory)."""
    if os.sep in target or target.endswith(".json"):
        return Path(target)
    return state_path(target)


def _ms(began: float) -> str:
    return f"{(time.monotonic() - began) * 1000:.0f} ms"
