"""The lifecycle of one service process: spawn, health by PID plus probe, stop with escalation."""

from __future__ import annotations

import logging
import os
import pwd
import re
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from io import FileIO
from pathlib import Path
from secrets import token_urlsafe
from typing import Protocol

from pytest_haico.errors import PortInUseError, StackError
from pytest_haico.files import (
    PRIVATE_FILE_MODE,
    create_file,
    start_write_error,
    write_all,
)
from pytest_haico.procfs import (
    death_signal_preexec,
    read_proc_stat,
    read_proc_uid,
    session_listens,
)
from pytest_haico.redact import Redactor
from pytest_haico.stack.service_log import LOG_HEADER, read_log_tail
from pytest_haico.stack.start_wait import StartWatch
from pytest_haico.stamps import utc_iso

logger = logging.getLogger(__name__)

_KILL_WAIT = 5.0


@dataclass(frozen=True, kw_only=True)
class Command:
    """How to exec a service: argv, the complete environment, and the OS user to run as."""

    argv: Sequence[str]
    env: Mapping[str, str]
    user: str | None = None
    cwd: Path | None = None


class Service(Protocol):
    """One service of the stack, as the orchestrator drives it.

    * `requires`: names that must be healthy before this one is spawned;
    * `waits_for`: the weaker `requires`, for a service that waits for them by itself
      (retrying, its probe failing until they answer): it is spawned once their ports
      are claimed, so its start overlaps theirs, counts as healthy only once they are,
      and is respawned if one of them moves to another port;
    * `start_timeout`: seconds from spawn to healthy (None: no deadline; `start_wait` has
      the limit on a silent log that a service may have instead);
    * `reserve()` runs once, in the orchestrator's thread, before `prepare`: it makes
      what `cleanup_paths` names, which the registry records before `prepare` fills it;
    * `prepare(log)` runs once, in a worker thread, before the first spawn;
      `cancel_prepare()` (from a stop, any thread) makes a running one end at once;
    * `stop_signal` at stop, `death_signal` when the owner dies (None: no such signal);
    * `secrets` are redacted from our log lines and messages; the janitor removes
      `cleanup_paths` if the owner dies (only directories made by
      `statedir.make_owned_tempdir`, or inside one);
    * `command(port)` for each attempt (a service that failed to bind gets another
      port); `probe(port)` is one health check and never raises; `on_healthy(port)`
      once it passes; `cleanup()` after the process stopped (and prepare returned).

    Optional: `stall_timeout_s`, `stall_setting` and `progress_every_s` attributes (see
    `StartWatch`): a model server loading its weights for tens of minutes is waited for
    while its log advances, and says which shard it is at.
    """

    @property
    def name(self) -> str: ...
    @property
    def requires(self) -> tuple[str, ...]: ...
    @property
    def waits_for(self) -> tuple[str, ...]: ...
    @property
    def start_timeout(self) -> float | None: ...
    @property
    def stop_signal(self) -> signal.Signals: ...
    @property
    def death_signal(self) -> signal.Signals | None: ...
    @property
    def secrets(self) -> tuple[str, ...]: ...
    @property
    def cleanup_paths(self) -> tuple[Path, ...]: ...

    def reserve(self) -> None: ...
    def prepare(self, log_path: Path) -> None: ...
    def cancel_prepare(self) -> None: ...
    def command(self, port: int) -> Command: ...
    def probe(self, port: int) -> bool: ...
    def on_healthy(self, port: int) -> None: ...
    def cleanup(self) -> None: ...


def new_secret() -> str:
    """A random URL-safe token for a per-run password, API key or admin token."""
    return token_urlsafe(24)


def inherited_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment plus `extra`: secrets reach a service here, never in argv."""
    return {**os.environ, **(extra or {})}


# Real model providers' credentials and tracing: a backend talks to the arm's model server
# only (its key comes in `extra`), and a LangChain that finds LANGSMITH_* or LANGCHAIN_*
# sends every conversation to a third party.
_PROVIDER_PREFIXES = (
    "OPENAI_",
    "AZURE_OPENAI_",
    "ANTHROPIC_",
    "GOOGLE_API_",
    "GEMINI_",
    "MISTRAL_",
    "COHERE_",
    "GROQ_",
    "TOGETHER_",
    "LANGCHAIN_",
    "LANGSMITH_",
    "HF_TOKEN",
    "HUGGING_FACE_HUB_TOKEN",
)


def provider_free_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """`inherited_env` without any provider's credentials or tracing settings (every
    `*_API_KEY` and `*_API_TOKEN` included): what a backend gets besides `extra`."""
    kept = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(_PROVIDER_PREFIXES) and not name.endswith(("_API_KEY", "_API_TOKEN"))
    }
    return {**kept, **(extra or {})}


def write_env_file(path: Path, env: Mapping[str, str], *, uid: int = -1, gid: int = -1) -> None:
    """Create `path` (it must not exist) holding `env` as KEY='value' lines, mode 0600 from
    its creation, owned by `uid`/`gid` (-1: this process's) before anything is written.

    The values are quoted as a shell would read them (Apptainer evaluates an env file).
    """
    lines = []
    for key, value in env.items():
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key) or "\0" in value or "\n" in value:
            raise StackError(f"{path}: refusing to write {key!r}: not a plain variable")
        lines.append(f"{key}={_shell_quote(value)}\n")
    fd = create_file(path, PRIVATE_FILE_MODE)  # never write-then-chmod: no moment of a wider mode
    try:
        if uid != -1 or gid != -1:
            os.fchown(fd, uid, gid)
        write_all(fd, "".join(lines).encode())
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    finally:
        os.close(fd)


def _shell_quote(value: str) -> str:
    return "'" + value.replace("'", "'\"'\"'") + "'"


def _user_ids(user: str) -> tuple[int, list[int]]:
    entry = pwd.getpwnam(user)
    # Without an explicit group list the child would keep root's supplementary groups.
    return entry.pw_gid, os.getgrouplist(user, entry.pw_gid)


class ServiceProcess:
    """One attempt at running a service on a port: spawn, `check` until healthy, `stop`."""

    def __init__(self, service: Service, port: int, log_path: Path, *, attempt: int = 1) -> None:
        self.service = service
        self.port = port
        self.log_path = log_path
        self.attempt = attempt
        self.pid: int | None = None
        self.start_time: int | None = None
        self.uid: int | None = None  # the real uid it runs as, which the janitor checks
        self.spawned_at: float | None = None
        self.healthy_at: float | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._status: int | None = None
        self._log_offset = 0
        self._stopped = False
        self._watch: StartWatch | None = None  # the limits on this attempt's start

    @property
    def healthy_seconds(self) -> float | None:
        """Spawn to healthy, in seconds."""
        if self.spawned_at is None or self.healthy_at is None:
            return None
        return self.healthy_at - self.spawned_at

    def _open_log(self) -> FileIO:
        """The log, unbuffered: a write that fails raises at once, never again at close."""
        try:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            return self.log_path.open("ab", buffering=0)
        except OSError as exc:
            raise self._log_failure(exc) from exc

    def _log_failure(self, exc: OSError) -> StackError:
        """The service's log cannot be written (a full disk, a quota, a read-only file
        system): where, on which file system, and the fix; the brief names the file."""
        return start_write_error(
            f"write the {self.service.name} log", self.log_path, exc, owner="log"
        )

    def spawn(self) -> None:
        """Start the process in its own session, with a parent-death signal, logging to the log."""
        if threading.current_thread() is not threading.main_thread():
            # PR_SET_PDEATHSIG fires when the spawning *thread* exits, not the process.
            raise StackError(f"{self.service.name}: services must be spawned from the main thread")
        name = self.service.name
        cmd = self.service.command(self.port)
        argv = [str(arg) for arg in cmd.argv]
        stamp = utc_iso()
        header = f"{LOG_HEADER}{stamp} {name} port {self.port} attempt {self.attempt}: "
        header += shlex.join(argv)
        gid: int | None = None
        groups: list[int] | None = None
        if cmd.user is not None:
            gid, groups = _user_ids(cmd.user)
        sig = self.service.death_signal
        preexec = death_signal_preexec(sig, os.getpid()) if sig is not None else None
        # The parent opens the log: a service running as another user can't open our paths.
        with self._open_log() as log:
            self._log_offset = log.tell()
            try:
                write_all(
                    log.fileno(), Redactor(self.service.secrets).redact(header).encode() + b"\n"
                )
            except OSError as exc:
                raise self._log_failure(exc) from exc
            try:
                self._proc = subprocess.Popen(
                    argv,
                    env=dict(cmd.env),
                    cwd=cmd.cwd,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    preexec_fn=preexec,
                    user=cmd.user,
                    group=gid,
                    extra_groups=groups,
                )
            except (OSError, subprocess.SubprocessError) as exc:
                raise StackError(f"{name}: could not start {argv[0]}: {exc}") from exc
        assert self._proc is not None
        self.spawned_at = time.monotonic()
        self._watch = StartWatch(
            self.service, self.log_path, offset=self._log_offset, spawned_at=self.spawned_at
        )
        self.pid = self._proc.pid
        stat = read_proc_stat(self.pid)
        self.start_time = stat.start_time if stat is not None else None
        self.uid = read_proc_uid(self.pid)  # Popen returns after the exec: the final uid
        logger.info("%s: spawned pid %d on port %d", name, self.pid, self.port)

    def log_tail(self) -> str:
        """The tail of this attempt's log lines, redacted."""
        return read_log_tail(self.log_path, offset=self._log_offset, secrets=self.service.secrets)

    def exit_status(self) -> int | None:
        """The exit code (negative: killed by that signal), or None while it runs.

        The leader is not reaped here: while it is a zombie its pid, which is also its
        process group id, cannot be reused, so `stop` can still kill the group safely.
        """
        if self._status is not None or self._proc is None:
            return self._status
        try:
            info = os.waitid(os.P_PID, self._proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            self._status = self._proc.returncode if self._proc.returncode is not None else -1
            return self._status
        if info is None:
            return None
        exited = info.si_code == os.CLD_EXITED
        self._status = info.si_status if exited else -info.si_status
        return self._status

    def _failure(self, what: str) -> str:
        return (
            f"{self.service.name} {what} (pid {self.pid}, port {self.port}, "
            f"attempt {self.attempt}); last lines of {self.log_path}:\n{self.log_tail()}"
        )

    def check_running(self, *, during: str) -> None:
        """Raise StackError, with the log tail, if this (healthy) process has exited."""
        status = self.exit_status()
        if status is not None:
            raise StackError(self._failure(f"exited with status {status} {during}"))

    def check(self, *, probe: bool = True) -> bool:
        """One health step: True once healthy; raises StackError if it died or ran out of time.

        `probe=False` only checks that it runs and has time left: a service whose
        dependencies are not healthy yet must not count as healthy itself.
        """
        if self.healthy_at is not None:
            return True
        if self._proc is None or self._watch is None:
            raise StackError(f"{self.service.name}: check() before spawn()")
        status = self.exit_status()
        if status is not None:
            message = self._failure(f"exited with status {status} before it was healthy")
            if "address already in use" in message.lower():
                raise PortInUseError(message)
            raise StackError(message)
        # Ownership first: a probe may carry a token, and must never reach a co-tenant.
        ours = (
            probe
            and session_listens(self._proc.pid, self.port) is not False
            and self.service.probe(self.port)
        )
        if ours:
            try:
                self.service.on_healthy(self.port)
            except Exception as exc:
                raise StackError(self._failure(f"answered but its setup failed: {exc}")) from exc
            self.healthy_at = time.monotonic()
            logger.info("%s: healthy after %.2f s", self.service.name, self.healthy_seconds)
            return True
        now = time.monotonic()
        overdue = self._watch.overdue(now)
        if overdue is not None:
            raise StackError(self._failure(overdue))
        self._watch.report_progress(now)
        return False

    def wait_healthy(self, *, poll: float = 0.05) -> None:
        """Block until `check` passes or raises."""
        while not self.check():
            time.sleep(poll)

    def _wait_exit(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while self.exit_status() is None:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)
        return True

    def stop(self, *, grace: float = 10.0) -> None:
        """Send the stop signal to the leader, wait `grace`, then SIGKILL the process group.

        Idempotent. Raises StackError only if the group survives SIGKILL.
        """
        if self._proc is None or self._stopped:
            return
        pid = self._proc.pid
        if self.exit_status() is None:
            _signal_group(pid, self.service.stop_signal, leader_only=True)
            if not self._wait_exit(grace):
                logger.warning(
                    "%s: still running %.1f s after %s; killing its process group",
                    self.service.name,
                    grace,
                    self.service.stop_signal.name,
                )
                _signal_group(pid, signal.SIGKILL)
                if not self._wait_exit(_KILL_WAIT):
                    raise StackError(f"{self.service.name} (pid {pid}) survived SIGKILL")
        # The leader is an unreaped zombie, so the group id is still ours: take the stragglers.
        _signal_group(pid, signal.SIGKILL)
        self._proc.wait()
        self._stopped = True


def _signal_group(pid: int, sig: signal.Signals, *, leader_only: bool = False) -> None:
    try:
        if leader_only:
            os.kill(pid, sig)
        else:
            os.killpg(pid, sig)
    except ProcessLookupError:
        pass
