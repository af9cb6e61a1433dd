"""A real Slurm of several nodes on one machine, for the tests: each node a namespace.

The controller (slurmctld, munged) runs in this machine's namespaces, on a bridge of its own.
Each compute node, and a login node, is a network namespace joined to the bridge by a veth
pair, with a UTS namespace for its hostname and a mount namespace that gives it its own
``/etc/hosts`` (every node's name) and a node-local TMPDIR: one path, the same on every node,
bind-mounted from that node's own directory, which a "reboot" wipes. Everything else is shared,
as a cluster's shared file system is. A node's namespaces are held by an anchor process (a
``sleep``), so that killing its slurmd, or every process of a "rebooted" node, keeps the node;
commands run on a node by entering the anchor's namespaces (`nsenter`).

What one kernel cannot show: real network latency, separate kernels and clocks, a GPU
interconnect, a file system whose locks cross hosts.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pytest_haico.procfs import is_alive
from tests.slurm.cluster import SlurmCluster, _terminate

SUBNET = "10.213"  # 10.213.<octet>.0/24, one octet per cluster; no route here uses it
LOGIN = "login"
SLURMD_TIMEOUT = 20  # seconds without a slurmd before the node is DOWN (default 300)


def missing_namespace_requirements() -> str | None:
    """Why network namespaces cannot be made here, or None when they can."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "nsenter", "unshare"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (iproute2 / util-linux)"
    return None


@dataclass
class Node:
    """One namespace of the cluster: a compute node or the login node."""

    name: str
    address: str
    root: Path  # its private directory: slurmd's log and pid file, its local TMPDIR
    anchor: subprocess.Popen[bytes] | None = None

    @property
    def netns(self) -> str:
        return f"haico-{self.address.replace('.', '-')}"

    @property
    def local_tmp(self) -> Path:
        """The directory behind this node's TMPDIR (seen from outside the node)."""
        return self.root / "tmp"


@dataclass
class MultiNodeCluster(SlurmCluster):
    """A private Slurm of `count` compute nodes (node1…) and a login node, each a namespace."""

    count: int = 3
    nodes: dict[str, Node] = field(default_factory=dict)
    octet: int | None = None
    # slurmd's spool holds the steps' Unix sockets, whose paths must stay under 108 bytes:
    # a short directory of its own, not one under pytest's deep tmp_path.
    spool: Path | None = None

    @property
    def bridge(self) -> str:
        return f"haicobr{self.octet}"

    @property
    def gateway(self) -> str:
        """The controller's address on the bridge."""
        return f"{SUBNET}.{self.octet}.1"

    @property
    def tmpdir(self) -> Path:
        """The TMPDIR every job gets (the site's TaskProlog sets it): node-local."""
        return Path("/tmp") / f"haico-node-tmp.{self.octet}"

    @property
    def compute(self) -> list[str]:
        return [name for name in self.nodes if name != LOGIN]

    # -- the network, before the config names its addresses ---------------------------------

    def start(self, timeout: float = 60.0) -> None:
        self.spool = Path(tempfile.mkdtemp(prefix="haico-spool-"))
        self._claim_subnet()
        try:
            super().start(timeout)
        except BaseException:
            self.stop()
            raise

    def _claim_subnet(self) -> None:
        """A bridge on the first free 10.213.x.0/24: `ip link add` is atomic between clusters."""
        addresses = subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True).stdout
        links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
        for octet in range(1, 255):
            # A veth outlives its cluster while a process still holds its namespace.
            if f" {SUBNET}.{octet}." in addresses or f" {_veth(octet, '')}" in links:
                continue
            self.octet = octet
            if subprocess.run(["ip", "link", "add", self.bridge, "type", "bridge"]).returncode:
                continue  # another cluster took it meanwhile
            _ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            names = [f"node{i}" for i in range(1, self.count + 1)]
            for index, name in enumerate([LOGIN, *names], start=10):
                self.nodes[name] = Node(
                    name, f"{SUBNET}.{octet}.{index}", self.base / "nodes" / name
                )
            return
        raise RuntimeError(f"no free {SUBNET}.x.0/24 for a test cluster")

    def topology(self) -> list[str]:
        prolog = self.base / "taskprolog"
        prolog.write_text(f"#!/bin/sh\necho export TMPDIR={self.tmpdir}\n")
        prolog.chmod(0o755)
        per_node = self.base / "nodes" / "%n"
        assert self.spool is not None
        lines = [
            f"SlurmctldHost={socket.gethostname().split('.')[0]}({self.gateway})",
            # Each node says 2 CPUs and 4 GiB whatever the machine has: config_overrides.
            "SlurmdParameters=config_overrides",
            f"SlurmdTimeout={SLURMD_TIMEOUT}",
            f"TaskProlog={prolog}",
            f"SlurmdSpoolDir={self.spool / '%n'}",
            f"SlurmdPidFile={per_node / 'slurmd.pid'}",
            f"SlurmdLogFile={per_node / 'slurmd.log'}",
        ]
        lines += [
            f"NodeName={node.name} NodeAddr={node.address} CPUs=2 RealMemory=4096 State=UNKNOWN"
            for node in self.nodes.values()
            if node.name != LOGIN
        ]
        # LLN: each job to the least loaded node, so that a campaign's tasks spread out.
        lines.append("PartitionName=debug Nodes=ALL Default=YES MaxTime=60 State=UP LLN=YES")
        return lines

    # -- nodes -------------------------------------------------------------------------------

    def start_nodes(self) -> None:
        self.tmpdir.mkdir(mode=0o1777, exist_ok=True)
        self.tmpdir.chmod(0o1777)
        hosts = self.base / "hosts"
        controller = socket.gethostname().split(".")[0]
        hosts.write_text(
            f"127.0.0.1 localhost\n{self.gateway} {controller}\n"
            + "".join(f"{node.address} {node.name}\n" for node in self.nodes.values())
        )
        for node in self.nodes.values():
            self._make_node(node, hosts)
        for name in self.compute:
            self.start_slurmd(name)

    def _make_node(self, node: Node, hosts: Path) -> None:
        node.local_tmp.mkdir(parents=True, exist_ok=True)
        if self.spool is not None:
            (self.spool / node.name).mkdir(exist_ok=True)
        node.local_tmp.chmod(0o1777)
        veth = self._veth(node)
        _ip("netns", "add", node.netns)
        _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", node.netns)
        _ip("link", "set", veth, "master", self.bridge, "up")
        _ip("-n", node.netns, "addr", "add", f"{node.address}/24", "dev", "eth0")
        _ip("-n", node.netns, "link", "set", "eth0", "up")
        _ip("-n", node.netns, "link", "set", "lo", "up")
        setup = (
            f"hostname {node.name} && mount --bind {node.local_tmp} {self.tmpdir}"
            f" && mount --bind {hosts} /etc/hosts && exec sleep infinity"
        )
        node.anchor = subprocess.Popen(
            ["nsenter", f"--net=/run/netns/{node.netns}", "--", "unshare", "--uts", "--mount",
             "--propagation", "private", "--", "sh", "-c", setup],
            start_new_session=True,
        )  # fmt: skip
        cmdline = Path(f"/proc/{node.anchor.pid}/cmdline")
        deadline = time.monotonic() + 10
        while not cmdline.read_bytes().startswith(b"sleep"):
            if node.anchor.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"node {node.name}'s namespaces could not be made")
            time.sleep(0.02)

    def _veth(self, node: Node) -> str:
        """The bridge end of the node's veth pair."""
        assert self.octet is not None
        return _veth(self.octet, node.address.rsplit(".", 1)[1])

    def start_slurmd(self, name: str) -> None:
        """Start the node's slurmd (again), inside the node."""
        self.run_on(name, "slurmd", check=True)

    def kill_slurmd(self, name: str) -> None:
        """A slurmd that dies: SIGKILL, its jobs' processes left running. The controller
        marks the node DOWN after SlurmdTimeout."""
        pid = self._node_pid(name)
        if pid is not None and is_alive(pid):
            os.kill(pid, signal.SIGKILL)

    def cut_network(self, name: str) -> None:
        """The node's only link down: nothing reaches it, and it reaches nothing, loopback
        aside."""
        _ip("-n", self.nodes[name].netns, "link", "set", "eth0", "down")

    def restore_network(self, name: str) -> None:
        _ip("-n", self.nodes[name].netns, "link", "set", "eth0", "up")

    def fill_disk(self, name: str) -> None:
        """The node's local disk full (an earlier job's leftovers): its TMPDIR a small tmpfs,
        filled. (A read-only one would not do: slurmstepd then sets TMPDIR=/tmp, which here
        is the shared file system.)"""
        fill = (
            f"mount -t tmpfs -o size=256k,mode=1777 haico-full {self.tmpdir}"
            f" && {{ dd if=/dev/zero of={self.tmpdir}/leftover bs=4k 2>/dev/null; true; }}"
        )
        self.run_on(name, "sh", "-c", fill, check=True)

    def reboot(self, name: str) -> None:
        """Every process of the node killed and its TMPDIR wiped; slurmd starts again once the
        controller has found the node gone (DOWN, its jobs NODE_FAIL), as after a real
        reboot, which takes longer than SlurmdTimeout."""
        self.power_off(name)
        self.wait_state(name, "down", timeout=SLURMD_TIMEOUT * 4)
        self.start_slurmd(name)

    def power_off(self, name: str) -> None:
        """The first half of a reboot: every process of the node killed, its TMPDIR wiped;
        the node stays off (no slurmd) until `start_slurmd`."""
        node = self.nodes[name]
        self.kill_processes(node)
        for child in node.local_tmp.iterdir():
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()

    def state(self, name: str) -> str:
        """The node's state as sinfo prints it: ``idle``, ``down*`` (``*``: not responding)."""
        return self.run("sinfo", "-h", "-n", name, "-o", "%T").stdout.strip()

    def wait_state(self, name: str, state: str, *, timeout: float) -> None:
        """Until the node's state (``*`` aside) is `state`."""
        deadline = time.monotonic() + timeout
        while (now := self.state(name)).rstrip("*") != state:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name} is {now!r}, not {state!r}, after {timeout} s")
            time.sleep(0.5)

    def kill_processes(self, node: Node) -> None:
        """SIGKILL to every process in the node's network namespace but its anchor."""
        anchor = node.anchor.pid if node.anchor else None
        for _ in range(50):
            pids = [pid for pid in self.processes_on(node.name) if pid != anchor]
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.05)
        raise RuntimeError(f"processes on {node.name} survived SIGKILL: {pids}")

    def commands_on(self, name: str) -> list[str]:
        """The command line of every process on the node but its anchor."""
        anchor = self.nodes[name].anchor
        commands = []
        for pid in self.processes_on(name):
            if anchor is not None and pid == anchor.pid:
                continue
            with contextlib.suppress(OSError):  # ended meanwhile
                commands.append(
                    Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
                )
        return commands

    def processes_on(self, name: str) -> list[int]:
        """The pids of every process on the node (in its network namespace)."""
        out = subprocess.run(
            ["ip", "netns", "pids", self.nodes[name].netns], capture_output=True, text=True
        ).stdout
        return [int(pid) for pid in out.split()]

    # -- commands on a node ------------------------------------------------------------------

    def on(self, name: str, argv: Sequence[str], *, cwd: Path | None = None) -> list[str]:
        """`argv` to run inside node `name` (its network, hostname and mounts), in `cwd`
        (default: this process's working directory)."""
        node = self.nodes[name]
        if node.anchor is None:
            raise RuntimeError(f"node {name} is not up")
        where = f"--wd={cwd or Path.cwd()}"
        return ["nsenter", f"--target={node.anchor.pid}", "--net", "--uts", "--mount", where,
                "--", *argv]  # fmt: skip

    def run_on(
        self,
        name: str,
        *argv: str,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        check: bool = False,
        timeout: float = 120,
    ) -> subprocess.CompletedProcess[str]:
        """A command on node `name`, pointed at this cluster, its TMPDIR the node's."""
        return subprocess.run(
            self.on(name, argv, cwd=cwd),
            env={**os.environ, **self.env, "TMPDIR": str(self.tmpdir), **(env or {})},
            capture_output=True,
            text=True,
            check=check,
            timeout=timeout,
        )

    # -- the cluster's files and its end -----------------------------------------------------

    def daemon_pids(self) -> dict[str, int | None]:
        pids = {"slurmctld": self._pid("slurmctld")}
        pids.update({f"slurmd on {name}": self._node_pid(name) for name in self.compute})
        return pids

    def log_path(self, daemon: str) -> Path:
        if daemon.startswith("slurmd on "):
            return self.nodes[daemon.removeprefix("slurmd on ")].root / "slurmd.log"
        return super().log_path(daemon)

    def _node_pid(self, name: str) -> int | None:
        try:
            return int((self.nodes[name].root / "slurmd.pid").read_text().strip())
        except (OSError, ValueError):
            return None

    def stop(self, grace: float = 15.0) -> None:
        """Every daemon by its pid, every process left on a node, the namespaces and the
        bridge."""
        super().stop(grace)
        for node in self.nodes.values():
            if node.anchor is not None:
                with contextlib.suppress(RuntimeError):
                    self.kill_processes(node)
                _terminate(node.anchor.pid, grace)
                node.anchor.wait()
                node.anchor = None
            subprocess.run(["ip", "netns", "del", node.netns], capture_output=True)
            # Deleting the veth ends it even while a straggler still holds the namespace.
            subprocess.run(["ip", "link", "del", self._veth(node)], capture_output=True)
        if self.octet is not None:
            subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)
        with contextlib.suppress(OSError):
            self.tmpdir.rmdir()
        if self.spool is not None:
            shutil.rmtree(self.spool, ignore_errors=True)


def _veth(octet: int, host: str) -> str:
    return f"hv{octet}x{host}"


def _ip(*argv: str) -> None:
    done = subprocess.run(["ip", *argv], capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"ip {' '.join(argv)}: {done.stderr.strip()}")
