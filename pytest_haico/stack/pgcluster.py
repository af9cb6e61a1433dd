"""A Postgres data directory: the user it belongs to, initdb, and the reusable template.

The template is an initialised cluster kept under $TMPDIR and copied for each run (4-9x
faster than initdb). Its name is predictable, so another user can create it first: it
is reused only from a directory of ours that nobody else can write, with its data
owned by the user the server runs as; otherwise this run initialises its own cluster.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pwd
import shutil
import signal
import stat
import subprocess
import tempfile
import threading
import time
import zlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock, Timeout

from pytest_haico.errors import StackError
from pytest_haico.files import ownership_problem
from pytest_haico.procfs import death_signal_preexec
from pytest_haico.stack.pgbinaries import PostgresBinaries
from pytest_haico.stack.service_log import read_log_tail
from pytest_haico.stack.statedir import PREFIX, ensure_private_dir

logger = logging.getLogger(__name__)

SUPERUSER = "postgres"
READONLY_ROLE = "haico_readonly"
DATABASE = "haico"
# Bump when the template's recipe changes, so no session copies an outdated one.
_TEMPLATE_RECIPE = 3
_SETUP_TIMEOUT = 120.0
_LOCK_POLL = 0.2  # how often a wait for another session's template build checks for a stop

# Run in template1; only it (CREATE DATABASE's default) and haico stay. template0 and the
# `postgres` database serve no run, and are half the files each run copies: creating
# files is the copy's cost (steep on ext4 right after a run deleted its copy).
_SETUP_SQL = f"""\
CREATE DATABASE {DATABASE}
CREATE ROLE {READONLY_ROLE} LOGIN
GRANT pg_read_all_data TO {READONLY_ROLE}
ALTER ROLE {READONLY_ROLE} SET default_transaction_read_only = on
ALTER DATABASE template0 IS_TEMPLATE false
DROP DATABASE template0
DROP DATABASE {SUPERUSER}
"""

# No trust anywhere: the launching OS user may use the superuser over the 0700 socket
# directory by peer credentials (to set the per-run passwords); TCP needs a password.
_PG_HBA = """\
local  all  all                 peer map=haico
host   all  all  127.0.0.1/32   scram-sha-256
"""


@dataclass(frozen=True)
class Owner:
    """The OS user the server runs as: never root, which Postgres refuses."""

    user: str | None  # None: this process's own user
    uid: int
    gid: int
    groups: tuple[int, ...]

    @classmethod
    def resolve(cls) -> Owner:
        """This process's user, or an unprivileged one (postgres, else nobody) under root."""
        if os.geteuid() != 0:
            return cls(None, os.geteuid(), os.getegid(), ())
        for name in ("postgres", "nobody"):
            try:
                entry = pwd.getpwnam(name)
            except KeyError:
                continue
            groups = tuple(os.getgrouplist(name, entry.pw_gid))
            return cls(name, entry.pw_uid, entry.pw_gid, groups)
        raise StackError("postgres: running as root and neither user postgres nor nobody exists")

    @property
    def dir_mode(self) -> int:
        """For a directory of ours holding this user's: 0711 lets it reach its own by name."""
        return 0o700 if self.user is None else 0o711

    def check_reaches(self, directory: Path) -> None:
        """Refuse `directory` (the $TMPDIR the server's files go in) if this user cannot enter it.

        Mode bits only, the check the kernel makes for a user without ACLs: a directory
        carrying an ACL is given the benefit of the doubt.
        """
        if self.user is None:
            return
        for path in (directory, *directory.parents):
            try:
                info = path.stat()
            except OSError:
                continue  # the mkdtemp that follows reports it
            if stat.S_IMODE(info.st_mode) & self._search_bit(info) or _has_acl(path):
                continue
            mode = stat.S_IMODE(info.st_mode)
            owner = _user_name(info.st_uid)
            raise StackError(
                f"postgres: the server runs as user {self.user} (this process is root), and "
                f"{self.user} cannot enter {path} (mode {mode:04o}, owner {owner}) on the way "
                f"to $TMPDIR {directory}; set TMPDIR to a directory {self.user} can reach "
                f"(TMPDIR=/tmp), or chmod o+x {path}, or run as an unprivileged user"
            )

    def _search_bit(self, info: os.stat_result) -> int:
        """The execute (search) bit the kernel checks for this user on a file of `info`."""
        if info.st_uid == self.uid:
            return stat.S_IXUSR
        if info.st_gid == self.gid or info.st_gid in self.groups:
            return stat.S_IXGRP
        return stat.S_IXOTH

    def chown(self, path: Path) -> None:
        """Give `path` to this user (a no-op unless it is another user)."""
        if self.user is not None:
            os.chown(path, self.uid, self.gid, follow_symlinks=False)

    def make_dir(self, path: Path) -> None:
        """A new 0700 directory of this user's (initdb, cp and the server fill it)."""
        path.mkdir(mode=0o700)
        self.chown(path)

    def run(
        self,
        argv: list[str],
        log_path: Path,
        *,
        stdin: str | None = None,
        helpers: Helpers | None = None,
    ) -> None:
        """Run a helper (initdb, cp, single-user postgres) as this user, appending to the log.

        It gets SIGKILL if this process dies, so a kill -9 leaves no copy running on into
        a directory the janitor is about to remove; `helpers.cancel()` kills it too.
        """
        helpers = helpers if helpers is not None else Helpers()
        helpers.check()  # a stopped preparation starts nothing
        with log_path.open("ab") as log:
            offset = log.tell()
            log.write(f"--- pytest-haico: {' '.join(argv)}\n".encode())
            log.flush()
            try:
                process = subprocess.Popen(
                    argv,
                    stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env={"PATH": os.environ.get("PATH", os.defpath), "LC_ALL": "C"},
                    cwd=tempfile.gettempdir(),  # our cwd may be closed to this user
                    user=self.user,
                    group=self.gid if self.user is not None else None,
                    extra_groups=list(self.groups) if self.user is not None else None,
                    preexec_fn=death_signal_preexec(signal.SIGKILL, os.getpid()),
                    start_new_session=True,  # its own group: a kill reaches its children too
                )
            except (OSError, subprocess.SubprocessError) as exc:
                raise StackError(f"postgres: {argv[0]} failed to run: {exc}") from exc
            with helpers.running(process):
                try:
                    process.communicate(
                        stdin.encode() if stdin is not None else None, timeout=_SETUP_TIMEOUT
                    )
                except subprocess.TimeoutExpired:
                    _kill_group(process)
                    process.wait()
                    raise StackError(
                        f"postgres: {Path(argv[0]).name} took over {_SETUP_TIMEOUT:.0f} s; "
                        f"see {log_path}"
                    ) from None
        helpers.check(argv)
        if process.returncode != 0:
            raise StackError(
                f"postgres: {Path(argv[0]).name} exited with status {process.returncode}; "
                f"last lines of {log_path}:\n{read_log_tail(log_path, offset=offset)}"
            )


class Helpers:
    """The helpers one preparation runs, so that a stop can end it at once: `cancel()`
    kills the running one (its whole process group) and refuses any further one."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: set[subprocess.Popen[bytes]] = set()
        self.cancelled = False

    @contextmanager
    def running(self, process: subprocess.Popen[bytes]) -> Iterator[None]:
        """Hold `process` as running: a cancel now (or already made) kills it."""
        with self._lock:
            self._running.add(process)
            if self.cancelled:
                _kill_group(process)
        try:
            yield
        finally:
            with self._lock:
                self._running.discard(process)

    def cancel(self) -> None:
        """Kill the running helper, if any; every later `check` raises."""
        with self._lock:
            self.cancelled = True
            for process in self._running:
                _kill_group(process)

    def check(self, argv: Sequence[str] | None = None) -> None:
        """Raise StackError if the preparation was cancelled (naming the helper, if any)."""
        if self.cancelled:
            what = f" ({Path(argv[0]).name} killed)" if argv else ""
            raise StackError(f"postgres: preparation cancelled: the stack is stopping{what}")


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)


def _has_acl(path: Path) -> bool:
    try:
        return "system.posix_acl_access" in os.listxattr(path)
    except OSError:
        return False


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def init_cluster(
    binaries: PostgresBinaries,
    data_dir: Path,
    owner: Owner,
    log_path: Path,
    helpers: Helpers | None = None,
) -> None:
    """initdb into `data_dir` (an empty directory of the owner's), then our roles and rules."""
    initdb = [str(binaries.tool("initdb")), "-D", str(data_dir), "-U", SUPERUSER, "-E", "UTF8"]
    initdb += ["--no-locale", "--auth-local=peer", "--auth-host=scram-sha-256"]
    owner.run([*initdb, "--no-instructions"], log_path, helpers=helpers)
    launcher = pwd.getpwuid(os.geteuid()).pw_name
    for name, text in (
        ("pg_hba.conf", _PG_HBA),
        ("pg_ident.conf", f"haico {launcher} {SUPERUSER}\n"),
    ):
        path = data_dir / name
        path.write_text(text)
        owner.chown(path)
    single = [str(binaries.tool("postgres")), "--single", "-D", str(data_dir)]
    setup = [*single, "-c", "exit_on_error=true", "template1"]
    owner.run(setup, log_path, stdin=_SETUP_SQL, helpers=helpers)


def copy_cluster(
    template: Path, data_dir: Path, owner: Owner, log_path: Path, helpers: Helpers | None = None
) -> None:
    """Copy the template's files into `data_dir` (an empty directory of the owner's)."""
    cp = shutil.which("cp") or "/bin/cp"
    owner.run([cp, "-a", f"{template}/.", str(data_dir)], log_path, helpers=helpers)


def _template_path(binaries: PostgresBinaries) -> Path:
    """`<templates dir>/<key>`, holding `data/`; the templates dir is per (effective) user."""
    build = zlib.crc32(str(binaries.bin_dir).encode())
    templates = Path(tempfile.gettempdir()) / f"{PREFIX}templates-{os.geteuid()}"
    return templates / f"pg{binaries.version}-{build:08x}-r{_TEMPLATE_RECIPE}"


def _template_problem(final: Path, owner: Owner) -> str | None:
    """Why `final` is no template of ours (None: reusable)."""
    try:
        problem = ownership_problem(os.lstat(final))
        if problem is not None:
            return f"{final} {problem}"
        data = os.lstat(final / "data")
    except FileNotFoundError as exc:
        return f"{exc.filename} is missing"
    # The data is the server user's; only it (and we) may have written there.
    if stat.S_ISLNK(data.st_mode) or not stat.S_ISDIR(data.st_mode):
        return f"{final / 'data'} is not a directory"
    if data.st_uid != owner.uid or data.st_mode & 0o077:
        return f"{final / 'data'} is not private to uid {owner.uid}"
    if not (final / "data" / "PG_VERSION").is_file():
        return f"{final / 'data'} is incomplete"
    return None


def ensure_template(
    binaries: PostgresBinaries, owner: Owner, log_path: Path, helpers: Helpers | None = None
) -> Path | None:
    """The per-machine initialised data directory, built once (atomically) and then reused.

    None if the templates directory is not ours and private: the caller then initialises
    its own cluster instead.
    """
    final = _template_path(binaries)
    try:
        templates = ensure_private_dir(
            final.parent,
            what="the Postgres template directory",
            mode=owner.dir_mode,
            fix="not using it: this run initialises its own cluster (remove it to speed runs up)",
        )
    except StackError as exc:
        logger.warning("postgres: %s", exc)
        return None
    if owner.user is not None:
        os.chmod(templates, owner.dir_mode)  # ours: the server's user must reach its template
    helpers = helpers if helpers is not None else Helpers()
    with _template_lock(templates / f"{final.name}.lock", helpers):
        problem = _template_problem(final, owner)
        if problem is None:
            return final / "data"
        if os.path.lexists(final):  # in our private directory: a leftover, safe to replace
            logger.warning("postgres: rebuilding the template: %s", problem)
            if final.is_symlink():
                final.unlink()
            shutil.rmtree(final, ignore_errors=True)
        build = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=templates))
        try:
            os.chmod(build, owner.dir_mode)
            owner.make_dir(build / "data")
            init_cluster(binaries, build / "data", owner, log_path, helpers)
            # A rename, so no session ever sees a half-built template.
            build.rename(final)
        except BaseException:
            shutil.rmtree(build, ignore_errors=True)
            raise
    logger.info("postgres: built the template %s", final / "data")
    return final / "data"


@contextmanager
def _template_lock(path: Path, helpers: Helpers) -> Iterator[None]:
    """The template's lock, waited for (while another session builds it) until a stop."""
    lock = FileLock(path)
    deadline = time.monotonic() + _SETUP_TIMEOUT
    while True:
        helpers.check()
        try:
            lock.acquire(timeout=_LOCK_POLL)
            break
        except Timeout:
            if time.monotonic() > deadline:
                raise StackError(
                    f"postgres: waited {_SETUP_TIMEOUT:.0f} s for {path} (another session "
                    "building the template); remove it if no session is running"
                ) from None
    try:
        yield
    finally:
        lock.release()
