"""The /proc reader: a process's stat whatever its command name holds, live or dead; the
sockets listening on a port."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from pytest_haico import procfs
from pytest_haico.procfs import boot_id, is_alive, live_start_time, read_proc_stat


@pytest.mark.subprocess
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


@pytest.mark.subprocess
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


def _inode(sock: socket.socket) -> str:
    return f"socket:[{os.fstat(sock.fileno()).st_ino}]"


def _listener(family: socket.AddressFamily, host: str) -> socket.socket:
    sock = socket.socket(family)
    sock.bind((host, 0))
    sock.listen()
    return sock


def test_the_socket_listening_on_a_port_is_found_and_no_connection_on_it() -> None:
    with _listener(socket.AF_INET, "127.0.0.1") as server:
        port = server.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)) as client:
            accepted, _ = server.accept()
            with accepted:  # an established socket on the same port: not listening
                assert procfs._diag_listening_inodes(port) == {_inode(server)}
                assert procfs._proc_listening_inodes(port) == {_inode(server)}
                assert _inode(accepted) not in procfs._listening_inodes(port)
                assert procfs._listening_inodes(client.getsockname()[1]) == set()
    assert procfs._listening_inodes(port) == set()  # closed


def test_a_socket_listening_over_ipv6_is_found() -> None:
    try:
        server = _listener(socket.AF_INET6, "::1")
    except OSError as exc:
        pytest.skip(f"no IPv6 loopback here: {exc}")
    with server:
        port = server.getsockname()[1]
        assert procfs._diag_listening_inodes(port) == {_inode(server)}
        assert procfs._proc_listening_inodes(port) == {_inode(server)}


def test_proc_net_tcp_answers_where_netlink_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(port: int) -> set[str]:
        raise PermissionError(1, "netlink refused by a seccomp filter")

    monkeypatch.setattr(procfs, "_diag_listening_inodes", refused)
    with _listener(socket.AF_INET, "127.0.0.1") as server:
        assert procfs._listening_inodes(server.getsockname()[1]) == {_inode(server)}
