"""Processes as /proc shows them (stat, uid, session, the boot), the sockets listening on a port
(sock_diag, /proc/net/tcp); parent-death signals. The only reader of /proc/<pid>/stat."""

from __future__ import annotations

import ctypes
import functools
import os
import signal
import socket
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class ProcStat:
    """The fields of /proc/<pid>/stat the lifecycle (and the benchmarks' CPU account) need."""

    pid: int
    state: str
    ppid: int
    pgid: int
    sid: int
    start_time: int  # clock ticks since boot: with the pid, identifies a process across pid reuse
    cpu_ticks: int  # user + system time of the process
    children_cpu_ticks: int  # user + system time of its children that it has reaped


def read_proc_stat(pid: int) -> ProcStat | None:
    """The process's stat, or None if there is no such process (or none this user may see:
    /proc mounted with hidepid shows only our own)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # comm (field 2) may contain spaces and parentheses; everything after the last ")" is plain.
    fields = raw[raw.rindex(")") + 2 :].split()
    return ProcStat(
        pid,
        state=fields[0],
        ppid=int(fields[1]),
        pgid=int(fields[2]),
        sid=int(fields[3]),
        start_time=int(fields[19]),
        cpu_ticks=int(fields[11]) + int(fields[12]),
        children_cpu_ticks=int(fields[13]) + int(fields[14]),
    )


def read_proc_uid(pid: int) -> int | None:
    """The real uid of the process, or None if there is no such process."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    for line in status.splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    return None


def live_start_time(pid: int) -> int | None:
    """When `pid` started (clock ticks since boot), or None if it is not running (a zombie
    has ended; its parent just has not reaped it)."""
    stat = read_proc_stat(pid)
    if stat is None or stat.state in ("Z", "X"):
        return None
    return stat.start_time


def is_alive(pid: int, start_time: int | None = None) -> bool:
    """Whether `pid` runs (zombies count as dead) and, if given, started at `start_time`."""
    started = live_start_time(pid)
    return started is not None and (start_time is None or started == start_time)


def boot_id() -> str | None:
    """This boot of the host (a start time means nothing across a reboot); None if unknown."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


def iter_processes() -> Iterator[ProcStat]:
    """Every live process (zombies left out)."""
    # Closed by `with` even when a caller stops early (the generator's close ends it).
    with os.scandir("/proc") as entries:
        for entry in entries:
            if entry.name.isdigit():
                stat = read_proc_stat(int(entry.name))
                if stat is not None and stat.state not in ("Z", "X"):
                    yield stat


def iter_session(sid: int) -> Iterator[ProcStat]:
    """Every live process of session `sid` (a service's leader pid is its session id)."""
    return (stat for stat in iter_processes() if stat.sid == sid)


# Linux's sock_diag netlink interface (linux/sock_diag.h, linux/inet_diag.h).
_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST_DUMP = 0x1 | 0x300
_NLMSG_ERROR, _NLMSG_DONE = 2, 3
_TCP_LISTEN = 10
_NLMSG_HEADER = struct.Struct("=IHHII")  # length, type, flags, sequence, port id
_DIAG_REQUEST = struct.Struct("=BBBBI48x")  # family, protocol, ext, pad, states; the socket id
_DIAG_PORT = struct.Struct("!H")  # the source port, first in the socket id of a reply
_DIAG_INODE = struct.Struct("=I")  # the last field of a reply (inet_diag_msg)
_DIAG_INODE_AT = 4 + 48 + 16  # after the family/state/timer/retrans bytes, the id and 4 u32s


def _listening_inodes(port: int) -> set[str]:
    """The socket inodes ("socket:[N]", as /proc/<pid>/fd links name them) listening on TCP
    `port`, any address, IPv4 or IPv6.

    Asked of the kernel's sock_diag (netlink), which walks only the listening sockets:
    about 0.1 ms, where reading /proc/net/tcp walks every bucket of the connection table
    (10 ms on a host with much memory), and a stack's start asks many times a second.
    /proc/net/tcp answers where netlink is refused (a seccomp filter, an old kernel).
    """
    try:
        return _diag_listening_inodes(port)
    except OSError:
        return _proc_listening_inodes(port)


def _diag_listening_inodes(port: int) -> set[str]:
    found: set[str] = set()
    kind = socket.SOCK_RAW | socket.SOCK_CLOEXEC
    with socket.socket(socket.AF_NETLINK, kind, _NETLINK_SOCK_DIAG) as link:
        link.settimeout(1.0)  # the kernel answers at once; never hang a health check
        for family in (socket.AF_INET, socket.AF_INET6):
            request = _DIAG_REQUEST.pack(family, socket.IPPROTO_TCP, 0, 0, 1 << _TCP_LISTEN)
            header = _NLMSG_HEADER.pack(
                _NLMSG_HEADER.size + len(request), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST_DUMP, 1, 0
            )
            link.send(header + request)
            found |= _read_dump(link, port)
    return found


def _read_dump(link: socket.socket, port: int) -> set[str]:
    """The inodes of the replies for `port`, until the dump's end."""
    found: set[str] = set()
    while True:
        data = link.recv(65536)
        if not data:
            raise OSError("sock_diag: the dump ended without its end message")
        offset = 0
        while offset + _NLMSG_HEADER.size <= len(data):
            length, kind, _, _, _ = _NLMSG_HEADER.unpack_from(data, offset)
            body = offset + _NLMSG_HEADER.size
            if kind == _NLMSG_DONE:
                return found
            if kind == _NLMSG_ERROR or length < _NLMSG_HEADER.size + _DIAG_INODE_AT + 4:
                raise OSError(f"sock_diag: refused (message type {kind})")
            if _DIAG_PORT.unpack_from(data, body + 4)[0] == port:
                found.add(f"socket:[{_DIAG_INODE.unpack_from(data, body + _DIAG_INODE_AT)[0]}]")
            offset += (length + 3) & ~3


def _proc_listening_inodes(port: int) -> set[str]:
    found: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:  # 0A = LISTEN
                found.add(f"socket:[{cols[9]}]")
    return found


def session_listens(sid: int, port: int) -> bool | None:
    """Whether a process of session `sid` holds the listening socket on `port` (None: can't tell).

    A co-tenant may have taken the port; checked before probing, so a probe (and the
    token it may carry) only ever reaches our own process.
    """
    sockets = _listening_inodes(port)
    if not sockets:
        return False
    unreadable = False
    for stat in iter_session(sid):
        try:
            fds = os.listdir(f"/proc/{stat.pid}/fd")
        except OSError:
            unreadable = True
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{stat.pid}/fd/{fd}") in sockets:
                    return True
            except OSError:
                continue
    return None if unreadable else False


@functools.cache
def _prctl() -> Callable[..., int]:
    libc = ctypes.CDLL(None, use_errno=True)
    prctl = libc.prctl
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    return prctl


def death_signal_preexec(sig: signal.Signals, parent: int) -> Callable[[], None]:
    """A `preexec_fn` giving the child `sig` when the spawning thread of `parent` ends."""
    # CPython's child runs setsid, setgroups, setregid, setreuid and only then preexec_fn,
    # so the death signal is set after the uid switch that would otherwise clear it.
    prctl = _prctl()  # resolved in the parent: the child only calls it

    def set_death_signal() -> None:
        if prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
        if os.getppid() != parent:  # the parent died before prctl: no signal will ever come
            os._exit(1)

    return set_death_signal
