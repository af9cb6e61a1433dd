"""The /proc reader: a process's stat whatever its command name holds, live or dead."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from pytest_haico.procfs import boot_id, is_alive, live_start_time, read_proc_stat


def test_a_command_name_with_spaces_and_parentheses_is_read_past(tmp_path: Path) -> None:
    sleep = shutil.which("sleep")
    assert sleep is not None
    odd = tmp_path / "a) (b c) d"  # the command name (comm) is the file name run
    odd.symlink_to(sleep)
    child = subprocess.Popen([str(odd), "60"])
    try:
        assert f"({odd.name})" in Path(f"/proc/{child.pid}/stat").read_text()
        stat = read_proc_stat(child.pid)
        assert stat is not None
        assert (stat.pid, stat.ppid) == (child.pid, os.getpid())
        assert stat.state in ("R", "S", "D")
        assert stat.sid == os.getsid(child.pid) and stat.pgid == os.getpgid(child.pid)
        assert live_start_time(child.pid) == stat.start_time
        assert is_alive(child.pid, stat.start_time)
        assert not is_alive(child.pid, stat.start_time + 1)  # another process, same pid
    finally:
        child.kill()
        child.wait()


def test_an_ended_process_has_no_start_time_even_before_it_is_reaped() -> None:
    assert live_start_time(os.getpid()) is not None
    child = subprocess.Popen(["true"])
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # a zombie until reaped
    stat = read_proc_stat(child.pid)
    assert stat is not None and stat.state == "Z"
    assert live_start_time(child.pid) is None
    assert not is_alive(child.pid)
    child.wait()
    assert read_proc_stat(child.pid) is None
    assert live_start_time(child.pid) is None


def test_the_boot_is_named() -> None:
    booted = boot_id()
    assert booted is not None and booted == boot_id()
    assert len(booted) == 36  # a UUID
