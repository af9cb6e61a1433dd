"""The state file of a stack `haico stack up` keeps: where its services are, what they serve,
who supervises them, and the secrets an attached run needs to talk to them.

It lives in the per-user state directory (`$TMPDIR/pytest-haico-<uid>/stacks`, mode 0700)
with mode 0600, and it is trusted only when `lstat` shows it is ours: a file another user
planted there, or one left by a supervisor that has ended, is refused with one line.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pytest_haico.config.experiment import Arm
from pytest_haico.config.settings import Profile
from pytest_haico.errors import StackError, UntrustedFileError
from pytest_haico.files import PRIVATE_FILE_MODE, read_owned_file, write_atomic
from pytest_haico.procfs import is_alive
from pytest_haico.stack.statedir import default_state_dir, ensure_private_dir

STATE_VERSION = 1
KIND = "pytest-haico kept stack"


@dataclass(frozen=True)
class KeptService:
    """One service of a kept stack: its process (pid and start time tell it apart from a
    later process with the same pid), its port, its log, and its health URL if it has one."""

    name: str
    pid: int
    start_time: int
    port: int
    log_path: str
    health_url: str | None = None
    health_auth: bool = False  # the health URL wants the admin token (the backend's)
    ready_s: float = 0.0  # the stack's start → healthy

    def alive(self) -> bool:
        return is_alive(self.pid, self.start_time)


@dataclass(frozen=True)
class KeptState:
    """Everything in a state file; the secrets stay out of its repr."""

    arm: str
    arm_file: str
    profile: str
    serves: Mapping[str, Any]  # what the stack serves, as `serves()` describes an arm
    backend_command: str | None
    supervisor_pid: int
    supervisor_start_time: int
    host: str
    started_at: str  # ISO 8601, UTC
    allocation: str | None  # SLURM_JOB_ID, when it was started in one
    directory: str  # <results>/<campaign>/<arm>/kept/<id>: logs, dumps, the supervisor's log
    dump_interval_s: float
    services: tuple[KeptService, ...]
    backend_url: str
    llm_url: str
    model_endpoint: str
    postgres_version: str
    api_key: str = field(repr=False)
    admin_token: str = field(repr=False)
    readonly_dsn: str = field(repr=False)
    secrets: tuple[str, ...] = field(repr=False, default=())  # every one, for redaction
    kind: str = KIND
    version: int = STATE_VERSION

    @property
    def campaign_dir(self) -> Path:
        """`<results>/<campaign>`: where the stack keeps its logs and dumps."""
        return Path(self.directory).parents[2]

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str, path: Path) -> KeptState:
        try:
            data = json.loads(text)
            if data.get("kind") != KIND or data.get("version") != STATE_VERSION:
                raise ValueError("kind")
            services = tuple(KeptService(**service) for service in data.pop("services"))
            secrets = tuple(str(secret) for secret in data.pop("secrets"))
            return cls(services=services, secrets=secrets, **data)
        except (ValueError, TypeError, AttributeError, KeyError):
            raise StackError(
                f"{path} is not a state file of `haico stack up` (version {STATE_VERSION}): "
                "give the file `haico stack up` printed"
            ) from None

    def supervisor_alive(self) -> bool:
        return is_alive(self.supervisor_pid, self.supervisor_start_time)


def serves(
    arm: Arm,
    profile: Profile,
    *,
    backend_image: str | None = None,
    site_image: str | None = None,
) -> dict[str, Any]:
    """What a stack of `arm` serves: the model, how vLLM serves it (on the local profile,
    the stand-in's behaviour too) and, on the cluster profile, the backend image it runs
    (--haico-backend-image, else the arm's, else cluster.env's). An edit of anything else
    (the generation and agent settings, concurrency) is a request setting: an attached run
    takes it as it is."""
    served = arm.model_dump(mode="json", include={"model", "vllm"})
    served["model"]["served_name"] = arm.served_name
    if profile is Profile.LOCAL:
        served["standin"] = arm.standin.model_dump(mode="json")
    else:
        served["backend"] = {"image": backend_image or arm.backend.image or site_image}
    return served


def serve_changes(kept: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    """`section.key: kept -> now` for each served setting that differs."""
    changes = []
    for section in sorted(set(kept) | set(now)):
        before, after = kept.get(section) or {}, now.get(section) or {}
        for key in sorted(set(before) | set(after)):
            old, new = before.get(key), after.get(key)
            if old != new:
                changes.append(f"{section}.{key}: {json.dumps(old)} -> {json.dumps(new)}")
    return changes


def stacks_dir() -> Path:
    """`$TMPDIR/pytest-haico-<uid>/stacks`: private to this user (0700), created if missing."""
    return ensure_private_dir(default_state_dir() / "stacks", what="the kept stacks' directory")


def state_path(arm: str) -> Path:
    """Where the state file of the kept stack of `arm` is."""
    return stacks_dir() / f"{arm}.json"


def write_state(path: Path, state: KeptState) -> None:
    write_atomic(path, state.to_json().encode(), mode=PRIVATE_FILE_MODE)


def read_state(path: Path) -> KeptState:
    """The state of a live kept stack of this user on this host; anything else is a
    `StackError` of one line saying what to do."""
    try:
        text = read_owned_file(path)
    except FileNotFoundError:
        raise StackError(
            f"{path}: no such state file; `haico stack status` lists the stacks kept up"
        ) from None
    except UntrustedFileError as exc:
        raise StackError(
            f"{exc}: not a state file of yours; give the file `haico stack up` printed"
        ) from None
    state = KeptState.from_json(text.decode("utf-8", "replace"), path)
    host = socket.gethostname()
    if state.host != host:
        raise StackError(
            f"{path}: the stack runs on {state.host}, not on this host ({host}): attach from "
            f"a shell on {state.host}"
        )
    if not state.supervisor_alive():
        raise StackError(
            f"{path}: the kept stack of arm {state.arm} is gone (its supervisor, pid "
            f"{state.supervisor_pid}, has ended; its logs: {state.directory}); start one with "
            f"`haico stack up {state.arm}`"
        )
    return state
