"""One command at a time: a second holder is told who holds the lock, a lock file that is
not the user's own is refused, and no lock at all rather than an unlocked submission."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import socket
from pathlib import Path

import pytest

from pytest_haico import locks
from pytest_haico.locks import LockError, LockHeldError, holding


def test_a_second_holder_waits_its_bound_then_is_told_who_holds_the_lock(tmp_path: Path) -> None:
    path = tmp_path / ".abc.lock"
    said: list[str] = []
    with (
        holding(path, what="submission abc", command="submit --stage smoke", say=pytest.fail),
        pytest.raises(LockHeldError) as locked,
        holding(path, what="submission abc", command="continue", say=said.append, wait_s=0.3),
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
    assert said == [f"haico: waiting up to 0.3 s for {holder} to finish with submission abc"]
    # Released with its holder: the next one gets it at once.
    with holding(path, what="submission abc", command="continue", say=pytest.fail, wait_s=0):
        assert path.stat().st_mode & 0o777 == 0o600


def test_a_lock_file_another_user_owns_is_refused(tmp_path: Path) -> None:
    path = tmp_path / ".abc.lock"
    path.write_text("")
    os.chown(path, 65534, 65534)
    with (
        pytest.raises(LockError, match=r"is owned by uid 65534 .*, not by uid"),
        holding(path, what="submission abc", command="continue", say=pytest.fail),
    ):
        pass


def test_a_symlink_in_place_of_the_lock_is_refused(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").write_text("")
    (tmp_path / ".abc.lock").symlink_to(tmp_path / "elsewhere")
    with (
        pytest.raises(LockError, match=r"cannot open the lock .* of submission abc"),
        holding(tmp_path / ".abc.lock", what="submission abc", command="continue"),
    ):
        pass


def test_a_file_system_without_flock_stops_haico_rather_than_go_on_unlocked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_flock(fd: int, operation: int) -> None:
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(fcntl, "flock", no_flock)
    with (
        pytest.raises(LockError) as refused,
        holding(tmp_path / ".abc.lock", what="haico env", command="env", say=pytest.fail),
    ):
        pytest.fail("went on unlocked")
    assert "does not support flock" in str(refused.value)
    assert "\n" not in str(refused.value)
    assert locks.LOCK_WAIT_S >= 30  # long enough for another command's sbatch calls


def test_the_holder_is_written_into_the_lock_and_a_second_holder_after_it_goes_at_once(
    tmp_path: Path,
) -> None:
    path = tmp_path / ".haico-env.lock"
    with holding(path, what="haico env", command="env"):
        holder = json.loads(path.read_text())
        assert holder["pid"] == os.getpid()
        assert holder["command"] == "env"
        assert holder["host"] == socket.gethostname()
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", holder["since"])
    with holding(path, what="haico env", command="env", wait_s=0):
        pass


def test_a_lock_file_others_may_write_is_refused(tmp_path: Path) -> None:
    path = tmp_path / ".standin.lock"
    path.write_text("")
    path.chmod(0o622)
    with (
        pytest.raises(LockError, match=r"is writable by group and others .*remove it"),
        holding(path, what="serving 'standin'", command="serve"),
    ):
        pytest.fail("held a lock others may write")


_MOUNTS = """\
22 27 0:21 / /proc rw,relatime - proc proc rw
27 1 8:1 / / rw,relatime - ext4 /dev/sda1 rw
40 27 0:50 / /lustre/work rw,relatime - lustre 10.0.0.1@o2ib:/work rw,{lustre}
41 27 0:51 / /home rw,relatime - nfs4 srv:/home rw,vers=4.2,{nfs}
42 27 0:52 / /beegfs rw,relatime - beegfs beegfs_nodev rw,cfgFile=/etc/beegfs/c.conf
43 40 0:53 / /lustre/work/my\\040dir rw,relatime - gpfs gpfs1 rw
"""


@pytest.mark.parametrize(
    ("path", "lustre", "nfs", "beegfs", "refused"),
    [
        ("/lustre/work/results/.lock", "flock", "", "", None),
        ("/lustre/work/results/.lock", "localflock", "", "", "mounted with localflock"),
        ("/home/me/results/.lock", "flock", "local_lock=none", "", None),
        (
            "/home/me/results/.lock",
            "flock",
            "local_lock=flock",
            "",
            "mounted with local_lock=flock",
        ),
        ("/home/me/results/.lock", "flock", "nolock", "", "mounted with nolock"),
        ("/beegfs/results/.lock", "flock", "", "", "tuneUseGlobalFileLocks = true"),
        ("/beegfs/results/.lock", "flock", "", "tuneUseGlobalFileLocks = true\n", None),
        # A mount inside another one: the inner one decides (a space in its name is \040).
        ("/lustre/work/my dir/results/.lock", "localflock", "", "", None),
        ("/scratch/results/.lock", "localflock", "local_lock=all", "", None),  # local ext4
    ],
)
def test_a_file_system_whose_locks_hold_on_this_host_only_is_named_with_its_fix(
    path: str, lustre: str, nfs: str, beegfs: str, refused: str | None
) -> None:
    mounts = _MOUNTS.format(lustre=lustre, nfs=nfs)
    why = locks.host_only_locks(Path(path), mounts, beegfs)
    if refused is None:
        assert why is None
    else:
        assert why is not None and refused in why, why
        assert why.startswith("/" + path.split("/")[1]), why  # it names the mount


def test_a_lock_on_a_host_only_file_system_is_refused_before_it_is_taken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        locks, "host_only_locks", lambda path: f"{path.parent} is nfs4 mounted with nolock"
    )
    refused = pytest.raises(LockError, match=r"cannot lock .* safely: .* mounted with nolock")
    with refused, holding(tmp_path / "lock", what="submission s", command="continue"):
        pytest.fail("the lock was taken")
