"""The files module: atomic writes survive short writes and full disks and leave nothing
behind, appends start on a fresh line, the guarded read refuses what another user could
have planted (without blocking on a FIFO), and concurrent `make_dirs` never trip."""

from __future__ import annotations

import errno
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from pytest_haico.errors import UntrustedFileError
from pytest_haico.files import (
    PRIVATE_FILE_MODE,
    append_line,
    atomic_file,
    link_new_file,
    make_dirs,
    publish_file,
    read_owned_file,
    shown_path,
    write_all,
    write_atomic,
)
from tests.conftest import Mount


@pytest.fixture
def short_writes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every `os.write` takes at most 3 bytes, as a write to a pipe or a full disk may."""
    real_write = os.write

    def write_three(fd: int, data: bytes | memoryview) -> int:
        return real_write(fd, bytes(data[:3]))

    monkeypatch.setattr(os, "write", write_three)


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# -- the atomic write -------------------------------------------------------------------


@pytest.mark.usefixtures("umask")
@pytest.mark.parametrize("mask", [0o077, 0o002, 0o000], ids=oct)
@pytest.mark.parametrize("mode", [0o640, PRIVATE_FILE_MODE, 0o444], ids=oct)
def test_an_atomic_write_has_exactly_its_mode_whatever_the_umask(
    tmp_path: Path, mask: int, mode: int
) -> None:
    os.umask(mask)
    path = tmp_path / "state.json"
    write_atomic(path, b"{}\n", mode=mode)
    assert (path.read_bytes(), mode_of(path)) == (b"{}\n", mode)


@pytest.mark.usefixtures("short_writes")
def test_an_atomic_write_writes_everything_through_short_writes(tmp_path: Path) -> None:
    path = tmp_path / "run-config.env"
    data = b"".join(f"KEY_{n}='value {n}'\n".encode() for n in range(500))
    write_atomic(path, data, mode=0o640)
    assert path.read_bytes() == data


def test_an_atomic_write_replaces_the_old_file_and_leaves_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "gates.json"
    path.write_bytes(b"old")
    write_atomic(path, b"new", mode=0o640)
    assert [p.name for p in tmp_path.iterdir()] == ["gates.json"]
    assert path.read_bytes() == b"new"


def test_a_failed_atomic_write_keeps_the_old_file_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "gates.json"
    path.write_bytes(b"old")
    real_write = os.write

    def disk_full_midway(fd: int, data: bytes | memoryview) -> int:
        real_write(fd, bytes(data[:2]))
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "write", disk_full_midway)
    with pytest.raises(OSError, match="No space left on device"):
        write_atomic(path, b"a new content", mode=0o640)
    assert [p.name for p in tmp_path.iterdir()] == ["gates.json"]
    assert path.read_bytes() == b"old"


def test_an_atomic_write_on_a_full_file_system_keeps_the_old_file(
    tmp_path: Path, tmpfs: Mount
) -> None:
    mount = tmpfs(tmp_path / "small", size="64k")
    path = mount / "run-config.json"
    write_atomic(path, b"old", mode=0o640)
    with pytest.raises(OSError) as failed:
        write_atomic(path, b"x" * (1 << 20), mode=0o640)
    assert failed.value.errno == errno.ENOSPC
    assert [p.name for p in mount.iterdir()] == ["run-config.json"]
    assert path.read_bytes() == b"old"


def test_an_atomic_write_fsyncs_the_file_then_its_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[str] = []
    real_fsync = os.fsync

    def record(fd: int) -> None:
        synced.append("directory" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", record)
    write_atomic(tmp_path / "claim.json", b"{}\n", mode=0o640)
    assert synced == ["file", "directory"]


def test_an_atomic_file_left_by_an_exception_changes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "phoenix.db"
    path.write_bytes(b"old")
    with pytest.raises(RuntimeError, match="copy failed"), atomic_file(path, mode=0o640) as fd:
        write_all(fd, b"half a database")
        raise RuntimeError("copy failed")
    assert [p.name for p in tmp_path.iterdir()] == ["phoenix.db"]
    assert path.read_bytes() == b"old"


def test_an_atomic_write_does_not_follow_a_symlink_in_place_of_its_file(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_bytes(b"theirs")
    path = tmp_path / "state.json"
    path.symlink_to(target)
    write_atomic(path, b"ours", mode=PRIVATE_FILE_MODE)
    assert not path.is_symlink()
    assert (path.read_bytes(), target.read_bytes()) == (b"ours", b"theirs")


@pytest.mark.usefixtures("umask")
def test_a_file_another_program_wrote_is_published_with_the_mode(tmp_path: Path) -> None:
    os.umask(0o022)
    partial = tmp_path / ".final.dump.partial"
    partial.write_bytes(b"PGDMP")
    partial.chmod(0o600)
    publish_file(partial, tmp_path / "final.dump", mode=0o640)
    assert [p.name for p in tmp_path.iterdir()] == ["final.dump"]
    assert mode_of(tmp_path / "final.dump") == 0o640


def test_a_linked_new_file_never_replaces_one_that_exists(tmp_path: Path) -> None:
    path = tmp_path / "shard-0of1.default.json"
    assert link_new_file(path, b"first\n", mode=0o640)
    assert not link_new_file(path, b"second\n", mode=0o640)
    assert [p.name for p in tmp_path.iterdir()] == [path.name]
    assert (path.read_bytes(), mode_of(path)) == (b"first\n", 0o640)


# -- the durable line append -------------------------------------------------------------


@pytest.mark.usefixtures("umask")
def test_an_append_creates_the_file_with_its_mode(tmp_path: Path) -> None:
    os.umask(0o077)
    path = tmp_path / "journal.jsonl"
    append_line(path, b'{"a":1}\n', mode=0o640)
    append_line(path, b'{"b":2}\n', mode=0o640)
    assert (path.read_bytes(), mode_of(path)) == (b'{"a":1}\n{"b":2}\n', 0o640)


def test_an_append_after_a_torn_line_starts_on_a_fresh_one(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    path.write_bytes(b'{"a":1}\n{"b":')  # a writer killed mid-line
    append_line(path, b'{"c":3}\n', mode=0o640)
    assert path.read_bytes().splitlines() == [b'{"a":1}', b'{"b":', b'{"c":3}']


@pytest.mark.usefixtures("short_writes")
def test_an_append_writes_the_whole_line_through_short_writes(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    line = b'{"state":"submitted","job":"smoke-demo","job_id":"4242"}\n'
    append_line(path, line, mode=0o640)
    append_line(path, line, mode=0o640)
    assert path.read_bytes() == line * 2


# -- the guarded read --------------------------------------------------------------------


def test_a_regular_private_file_of_ours_is_read(tmp_path: Path) -> None:
    path = tmp_path / "claim.json"
    write_atomic(path, b"{}", mode=PRIVATE_FILE_MODE)
    assert read_owned_file(path) == b"{}"


def test_a_missing_file_is_not_found(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        read_owned_file(tmp_path / "gone.json")


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path: Path) -> None:
    fifo = tmp_path / "state.json"
    os.mkfifo(fifo, 0o600)
    outcome: list[BaseException] = []
    reader = threading.Thread(target=lambda: _read_into(fifo, outcome), daemon=True)
    reader.start()
    reader.join(timeout=30)  # a bound against hanging the suite, not a speed check
    if reader.is_alive():
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # release the blocked open
        pytest.fail("reading a FIFO waited for a writer")
    assert len(outcome) == 1 and isinstance(outcome[0], UntrustedFileError)
    assert str(outcome[0]) == f"{fifo} is not a regular file"


def _read_into(path: Path, outcome: list[BaseException]) -> None:
    try:
        read_owned_file(path)
    except BaseException as exc:
        outcome.append(exc)


def test_a_symlink_is_refused_even_to_a_file_of_ours(tmp_path: Path) -> None:
    target = tmp_path / "real.json"
    write_atomic(target, b"{}", mode=PRIVATE_FILE_MODE)
    link = tmp_path / "state.json"
    link.symlink_to(target)
    with pytest.raises(UntrustedFileError, match=r"state\.json is a symbolic link$"):
        read_owned_file(link)


def test_a_file_of_another_user_is_refused(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("giving a file to another user needs root")
    path = tmp_path / "state.json"
    write_atomic(path, b"{}", mode=PRIVATE_FILE_MODE)
    os.chown(path, 65534, 65534)
    with pytest.raises(UntrustedFileError) as refused:
        read_owned_file(path)
    assert refused.value.path == path
    assert refused.value.problem.startswith("is owned by uid 65534")
    assert refused.value.problem.endswith("not by uid 0 (root)")


@pytest.mark.parametrize(
    ("mode", "problem"),
    [(0o620, "is writable by group (mode 0620)"), (0o606, "is writable by others (mode 0606)")],
)
def test_a_file_others_may_write_is_refused(tmp_path: Path, mode: int, problem: str) -> None:
    path = tmp_path / "state.json"
    write_atomic(path, b"{}", mode=mode)
    with pytest.raises(UntrustedFileError) as refused:
        read_owned_file(path)
    assert str(refused.value) == f"{path} {problem}"


# -- directories -------------------------------------------------------------------------


@pytest.mark.usefixtures("umask")
def test_directories_are_made_with_the_results_mode(tmp_path: Path) -> None:
    os.umask(0o077)
    make_dirs(tmp_path / "results" / "demo" / "ledger", 0o640)
    made = [tmp_path / "results", tmp_path / "results" / "demo", tmp_path / "results/demo/ledger"]
    assert [mode_of(path) for path in made] == [0o750] * 3


def test_a_file_in_the_way_of_a_directory_is_named(tmp_path: Path) -> None:
    (tmp_path / "results").write_text("not a directory")
    with pytest.raises(NotADirectoryError) as failed:
        make_dirs(tmp_path / "results" / "demo", 0o640)
    assert (failed.value.errno, failed.value.filename) == (errno.ENOTDIR, str(tmp_path / "results"))


# One array task: it says when it is ready, waits for the start, then makes every task's
# directories (the same ones, in the same order, as every other task).
_TASK = """
import sys
from pathlib import Path
from pytest_haico.files import make_dirs
print("ready", flush=True)
sys.stdin.read(1)
for n in range(int(sys.argv[2])):
    make_dirs(Path(sys.argv[1]) / str(n) / "demo" / "runs" / "logs", 0o640)
"""


@pytest.mark.subprocess
def test_processes_making_the_same_directories_at_once_all_succeed(tmp_path: Path) -> None:
    argv = [sys.executable, "-c", _TASK, str(tmp_path), "500"]
    pipe = subprocess.PIPE
    tasks = [
        subprocess.Popen(argv, stdin=pipe, stdout=pipe, stderr=subprocess.STDOUT) for _ in range(6)
    ]
    for task in tasks:
        assert task.stdout is not None and task.stdout.readline() == b"ready\n"
    for task in tasks:  # the start, once every task is ready
        assert task.stdin is not None
        task.stdin.write(b"g")
        task.stdin.flush()
    outputs = [task.communicate()[0].decode() for task in tasks]
    assert [task.returncode for task in tasks] == [0] * len(tasks), "\n".join(outputs)
    assert {mode_of(path) for path in tmp_path.rglob("*")} == {0o750}
    assert len(list(tmp_path.glob("*/demo/runs/logs"))) == 500


def test_a_path_is_shown_relative_to_here_else_under_home_else_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home, here = tmp_path / "home", tmp_path / "home" / "project"
    here.mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(here)
    assert shown_path(here / "results" / "c") == "results/c"
    assert shown_path(home / "other" / "c") == "~/other/c"
    assert shown_path(tmp_path / "elsewhere") == str(tmp_path / "elsewhere")
    assert shown_path(home / "other", here=home) == "other"
