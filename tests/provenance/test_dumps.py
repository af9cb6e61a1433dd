"""pg_dumps of a real Postgres: complete, restorable, rotated, never another run's."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import psycopg
import pytest

from pytest_haico.errors import DumpError
from pytest_haico.procfs import is_alive
from pytest_haico.provenance.dumps import DatabaseDumps
from pytest_haico.stack import Orchestrator, PostgresService
from pytest_haico.stack.service import Command
from tests.polling import wait_for


@pytest.fixture(scope="module")
def seeded(postgres_service: PostgresService) -> PostgresService:
    with psycopg.connect(postgres_service.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS dump_probe (id int, body jsonb)")
        conn.execute("INSERT INTO dump_probe SELECT g, '{}'::jsonb FROM generate_series(1, 50) g")
    return postgres_service


def _restore_list(postgres: PostgresService, dump: Path) -> str:
    result = subprocess.run(
        [str(postgres.binaries.tool("pg_restore")), "--list", str(dump)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_a_final_dump_is_complete_restorable_and_group_readable(
    seeded: PostgresService, tmp_path: Path
) -> None:
    dumps = DatabaseDumps(seeded, tmp_path / "dumps", interval_s=0)
    path = dumps.dump("final")
    assert path.parent == tmp_path / "dumps"
    assert path.name.startswith("final-") and path.suffix == ".dump"
    assert "TABLE DATA public dump_probe" in _restore_list(seeded, path)
    assert path.stat().st_mode & 0o777 == 0o640
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no partial file left


def test_periodic_dumps_keep_only_the_newest_of_this_run(
    seeded: PostgresService, tmp_path: Path
) -> None:
    dumps_dir = tmp_path / "dumps"
    dumps_dir.mkdir()
    earlier = dumps_dir / "periodic-20200101T000000Z.dump"  # not written by this run
    earlier.write_bytes(b"an earlier run's dump")
    dumps = DatabaseDumps(seeded, dumps_dir, interval_s=0.05)
    dumps.start_periodic()
    wait_for(lambda: len(dumps.written) >= 3, timeout=60, what="3 periodic dumps")
    dumps.stop_periodic()
    final = dumps.dump("final")
    ours = sorted(p for p in dumps_dir.iterdir() if p != earlier)
    assert ours == sorted([dumps.written[-2], final])  # the newest periodic and the final
    assert earlier.read_bytes() == b"an earlier run's dump"
    for path in ours:
        _restore_list(seeded, path)


def test_the_password_never_reaches_pg_dumps_argv(seeded: PostgresService, tmp_path: Path) -> None:
    command = seeded.dump_command(tmp_path / "x.dump")
    assert not any(secret in arg for secret in seeded.secrets for arg in command.argv)
    assert command.env["PGPASSWORD"] in seeded.secrets


def test_a_failed_dump_raises_a_redacted_error_and_leaves_no_partial_file(
    tmp_path: Path,
) -> None:
    postgres = PostgresService()
    with Orchestrator([postgres], tmp_path / "logs"):
        dumps = DatabaseDumps(postgres, tmp_path / "dumps", interval_s=0)
    # The server is stopped now: pg_dump cannot connect.
    with pytest.raises(DumpError, match=r"pg_dump \(final\) exited 1") as raised:
        dumps.dump("final")
    assert not any(secret in str(raised.value) for secret in postgres.secrets)
    assert list((tmp_path / "dumps").iterdir()) == []


def _wrapped(postgres: PostgresService, monkeypatch: pytest.MonkeyPatch, script: str) -> None:
    """pg_dump's command run by `sh -c script PARTIAL ARGV...` (the dump's own argv last)."""
    dump_command = postgres.dump_command

    def wrapped(path: Path) -> Command:
        command = dump_command(path)
        argv = ["sh", "-c", script, "sh", str(path), *command.argv]
        return Command(argv=argv, env=command.env, user=command.user, cwd=command.cwd)

    monkeypatch.setattr(postgres, "dump_command", wrapped)


def test_the_partial_file_has_the_results_mode_before_pg_dump_writes_it(
    seeded: PostgresService, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = tmp_path / "mode"
    _wrapped(seeded, monkeypatch, f'stat -c %a "$1" > {seen}; shift; exec "$@"')
    monkeypatch.setattr(os, "umask", os.umask)  # restored after the test
    os.umask(0o022)  # pg_dump's own file would be 0644
    path = DatabaseDumps(seeded, tmp_path / "dumps", interval_s=0, file_mode=0o640).dump("final")
    assert seen.read_text().strip() == "640"
    assert path.stat().st_mode & 0o777 == 0o640


def test_a_dump_interrupted_while_it_runs_leaves_no_partial_file_and_no_pg_dump(
    seeded: PostgresService, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pid_file = tmp_path / "pid"
    # As pg_dump does: the output file first, then the (long) work.
    _wrapped(seeded, monkeypatch, f': > "$1"; echo $$ > {pid_file}; exec sleep 60')

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 1.0)
        with pytest.raises(KeyboardInterrupt):
            DatabaseDumps(seeded, tmp_path / "dumps", interval_s=0).dump("final")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert list((tmp_path / "dumps").iterdir()) == []
    assert not is_alive(int(pid_file.read_text()))
