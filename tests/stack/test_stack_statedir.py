"""The per-user state directory under $TMPDIR is used only if it is ours and private."""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pytest_haico.errors import StackError
from pytest_haico.procfs import is_alive
from pytest_haico.stack import Orchestrator, ServiceRecord, reap_orphans
from pytest_haico.stack.statedir import default_state_dir
from tests.stack.stack_helpers import (
    give_to_nobody,
    needs_root,
    record_of,
    tiny,
    victim,
    write_registry,
)

FIX = "remove it (as its owner or root) or set TMPDIR to a directory of your own (mode 0700)"


@pytest.fixture
def tmpdir_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A fresh $TMPDIR for this test, shared by everyone like /tmp (mode 1777)."""
    path = tmp_path / "tmp"
    path.mkdir()
    path.chmod(0o1777)
    monkeypatch.setattr(tempfile, "tempdir", str(path))
    yield path


def _another_users(state: Path, records: list[ServiceRecord]) -> Path:
    registry = write_registry(state / "services" / "1.json", records)
    give_to_nobody(state, state / "services", mode=0o777)
    give_to_nobody(registry)
    return registry


def _writable_by_others(state: Path, records: list[ServiceRecord]) -> Path:
    registry = write_registry(state / "services" / "1.json", records)
    state.chmod(0o777)
    return registry


def _a_symlink(state: Path, records: list[ServiceRecord]) -> Path:
    elsewhere = state.with_name("elsewhere")
    registry = write_registry(elsewhere / "services" / "1.json", records)
    elsewhere.chmod(0o700)
    state.symlink_to(elsewhere)
    return registry


@pytest.mark.parametrize(
    ("plant", "problem"),
    [
        pytest.param(
            _another_users,
            "is owned by uid 65534 (nobody), not by uid 0 (root)",
            id="another-user",
            marks=needs_root,
        ),
        pytest.param(
            _writable_by_others, "is writable by group and others (mode 0777)", id="world-writable"
        ),
        pytest.param(_a_symlink, "is a symbolic link", id="symlink"),
    ],
)
def test_a_state_directory_not_private_to_us_is_refused_and_nothing_is_reaped(
    tmp_path: Path,
    tmpdir_root: Path,
    plant: Callable[[Path, list[ServiceRecord]], Path],
    problem: str,
) -> None:
    # Planted before our first run: a registry of a "dead owner" naming a process of
    # ours and a private directory of ours.
    state = tmpdir_root / f"pytest-haico-{os.getuid()}"
    precious = tmp_path / "precious"
    precious.mkdir(mode=0o700)
    with victim() as process:
        registry = plant(state, [record_of(process, cleanup=(str(precious),))])
        with pytest.raises(StackError) as caught:
            reap_orphans(timeout=1)
        assert is_alive(process.pid)
    assert str(caught.value) == (
        f"the pytest-haico state directory {state} {problem}; {FIX}, then run again"
    )
    assert precious.is_dir()
    assert registry.exists()


def test_a_stack_on_a_state_directory_writable_by_others_starts_nothing(
    tmp_path: Path, tmpdir_root: Path
) -> None:
    state = tmpdir_root / f"pytest-haico-{os.getuid()}"
    state.mkdir()
    state.chmod(0o777)
    spawned: list[int] = []
    service = tiny(argv_hook=spawned.append)
    with pytest.raises(StackError, match=f"^the pytest-haico state directory {state} is writable"):
        Orchestrator([service], tmp_path / "logs").start()
    assert spawned == []


def test_a_new_state_directory_is_made_private(tmpdir_root: Path) -> None:
    state = default_state_dir()
    info = state.lstat()
    assert state == tmpdir_root / f"pytest-haico-{os.getuid()}"
    assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (os.geteuid(), 0o700)
    assert default_state_dir() == state  # and reused
