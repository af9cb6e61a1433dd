"""One writer per submission: the lock beside the journal, its holder named to a second
command, and no lock at all rather than an unlocked submission."""

from __future__ import annotations

import errno
import fcntl
import os
import socket
from pathlib import Path

import pytest

from pytest_haico.submit import lock
from pytest_haico.submit.jobs import SubmitError
from pytest_haico.submit.lock import SubmissionLocked, holding


def test_a_second_holder_waits_its_bound_then_is_told_who_holds_the_lock(tmp_path: Path) -> None:
    path = tmp_path / ".abc.lock"
    said: list[str] = []
    with (
        holding(path, command="submit --stage smoke", say=pytest.fail),
        pytest.raises(SubmissionLocked) as locked,
        holding(path, command="continue", say=said.append, wait_s=0.3),
    ):
        pytest.fail("two holders at once")
    message = str(locked.value)
    assert message.startswith(
        f"submission abc is locked by `haico submit --stage smoke` (pid {os.getpid()} on host "
        f"{socket.gethostname()}, since "
    )
    assert message.endswith("wait for it to finish, then run this command again")
    assert "--force" not in message
    holder = message.removeprefix("submission abc is locked by ").split(": wait")[0]
    assert said == [f"haico: waiting up to 0.3 s for {holder} to finish with the submission"]
    # Released with its holder: the next one gets it at once.
    with holding(path, command="continue", say=pytest.fail, wait_s=0):
        assert path.stat().st_mode & 0o777 == 0o600


def test_a_lock_file_another_user_owns_is_refused(tmp_path: Path) -> None:
    path = tmp_path / ".abc.lock"
    path.write_text("")
    os.chown(path, 65534, 65534)
    with (
        pytest.raises(SubmitError, match=r"is owned by uid 65534 .*, not by uid"),
        holding(path, command="continue", say=pytest.fail),
    ):
        pass


def test_a_symlink_in_place_of_the_lock_is_refused(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").write_text("")
    (tmp_path / ".abc.lock").symlink_to(tmp_path / "elsewhere")
    with (
        pytest.raises(SubmitError, match="cannot open the submission lock"),
        holding(tmp_path / ".abc.lock", command="continue", say=pytest.fail),
    ):
        pass


def test_a_file_system_without_flock_stops_haico_rather_than_go_on_unlocked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_flock(fd: int, operation: int) -> None:
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(fcntl, "flock", no_flock)
    with (
        pytest.raises(SubmitError) as refused,
        holding(tmp_path / ".abc.lock", command="continue", say=pytest.fail),
    ):
        pytest.fail("went on unlocked")
    assert "does not support flock" in str(refused.value)
    assert "\n" not in str(refused.value)
    assert lock.LOCK_WAIT_S >= 30  # long enough for another command's sbatch calls
