"""The Postgres template under $TMPDIR is reused only if it is ours, else built privately."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from pytest_haico.stack import Orchestrator, PostgresService, find_postgres_binaries
from pytest_haico.stack.pgcluster import _template_path
from tests.stack.stack_helpers import give_to_nobody, needs_root

# What another user's template would hold to take over our server: our database and
# role (so it passes for ours), a superuser of theirs, and trust for every connection.
_PLANT_SQL = """\
CREATE DATABASE haico
CREATE ROLE haico_readonly LOGIN
CREATE ROLE intruder SUPERUSER LOGIN
"""


@pytest.fixture
def shared_tmpdir(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A fresh $TMPDIR shared like /tmp (mode 1777), reachable by the server's user."""
    path = Path(tempfile.mkdtemp(prefix="haico-test-tmp-"))
    path.chmod(0o1777)
    monkeypatch.setattr(tempfile, "tempdir", str(path))
    monkeypatch.delenv("PGPASSWORD", raising=False)
    monkeypatch.setenv("PGPASSFILE", os.devnull)
    yield path
    shutil.rmtree(path)


def _as_nobody(argv: list[str], cwd: Path, stdin: str | None = None) -> None:
    nobody = pwd.getpwnam("nobody")
    subprocess.run(
        argv,
        input=stdin.encode() if stdin is not None else None,
        capture_output=True,
        cwd=cwd,
        env={"PATH": os.defpath, "LC_ALL": "C"},
        user=nobody.pw_uid,
        group=nobody.pw_gid,
        extra_groups=[],
        timeout=120,
        check=True,
    )


@pytest.fixture(scope="module")
def planted_cluster() -> Iterator[Path]:
    """Another user's cluster (initdb as nobody), group-readable by the server's user."""
    if os.geteuid() != 0:
        pytest.skip("only root can make files owned by another user")
    scratch = Path(tempfile.mkdtemp(prefix="haico-test-plant-"))
    scratch.chmod(0o777)
    binaries = find_postgres_binaries()
    data = scratch / "data"
    initdb = [str(binaries.tool("initdb")), "-D", str(data), "-U", "postgres", "-A", "trust"]
    _as_nobody([*initdb, "-g", "--no-locale", "-E", "UTF8", "--no-instructions"], scratch)
    single = [str(binaries.tool("postgres")), "--single", "-D", str(data), "template1"]
    _as_nobody(single, scratch, stdin=_PLANT_SQL)
    # Readable by a group the server's user is in, as a research group's members share one.
    server_gid = pwd.getpwnam(PostgresService().user or "nobody").pw_gid
    for root, dirs, files in os.walk(data):
        for name in [".", *dirs, *files]:
            os.chown(Path(root) / name, -1, server_gid)
    yield data
    shutil.rmtree(scratch)


def _plant_template(tmpdir: Path, final: Path, cluster: Path, *, theirs_from: Path) -> None:
    """Another user's cluster at `final`; the directories from `theirs_from` down are theirs."""
    path = tmpdir
    for part in final.relative_to(tmpdir).parts:
        path = path / part
        path.mkdir(mode=0o711)
        if path == theirs_from or theirs_from in path.parents:
            give_to_nobody(path, mode=0o777)
    subprocess.run(["cp", "-a", str(cluster), str(final / "data")], check=True)


@needs_root
@pytest.mark.parametrize("theirs", ["templates-directory", "template"])
def test_a_template_planted_by_another_user_is_not_used(
    tmp_path: Path, shared_tmpdir: Path, planted_cluster: Path, theirs: str
) -> None:
    final = _template_path(find_postgres_binaries())
    theirs_from = (
        final if theirs == "template" else shared_tmpdir / final.relative_to(shared_tmpdir).parts[0]
    )
    _plant_template(shared_tmpdir, final, planted_cluster, theirs_from=theirs_from)
    service = PostgresService()
    with Orchestrator([service], tmp_path / "logs", state_dir=tmp_path, reap=False):
        # The planted pg_hba.conf trusted everyone: ours asks for the password.
        with pytest.raises(psycopg.OperationalError, match="no password supplied"):
            psycopg.connect(
                host=service.host, port=service.port, user="postgres", dbname="haico"
            ).close()
        with psycopg.connect(service.dsn) as conn:
            roles = conn.execute("SELECT rolname FROM pg_roles WHERE rolname = 'intruder'")
            assert roles.fetchall() == []
