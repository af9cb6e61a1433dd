"""A real single-node Slurm (munge, slurmctld, slurmd) in a private directory, for the tests.

Everything lives under one base directory of mode 0700: a private munge key and socket,
slurm.conf, state, spool, pid and log files. Daemons are stopped by the PIDs in their pid
files, never by name. The recipe is the one verified in the project's notes (Slurm 22.05,
Debian 12, root, no systemd, no cgroups).
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pytest_haico.procfs import is_alive
from pytest_haico.slurm.records import FINAL_STATES

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "squeue", "scontrol", "scancel", "sinfo", "salloc", "srun")


def missing_requirements() -> str | None:
    """Why a real Slurm cannot run here, or None when it can."""
    if os.geteuid() != 0:
        return "the Slurm daemons need root (SlurmUser=root)"
    missing = [name for name in (*DAEMONS, *CLIENTS, "munge") if shutil.which(name) is None]
    if missing and not all(Path(f"/usr/sbin/{m}").exists() for m in missing):
        return f"Slurm is not installed (missing: {', '.join(missing)}); see .ci/run"
    return None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _node_line() -> str:
    """`slurmd -C`'s node line, so CPUs and memory match the machine."""
    first = subprocess.run(
        ["slurmd", "-C"], capture_output=True, text=True, check=True
    ).stdout.splitlines()[0]
    return f"{first} NodeAddr=127.0.0.1 State=UNKNOWN"


@dataclass
class SlurmCluster:
    """One private Slurm cluster; `env` points its client commands at it."""

    base: Path

    @property
    def conf(self) -> Path:
        return self.base / "slurm.conf"

    @property
    def munge_socket(self) -> Path:
        return self.base / "munge" / "socket"

    @property
    def jobcomp(self) -> Path:
        return self.base / "log" / "jobcomp.txt"

    @property
    def env(self) -> Mapping[str, str]:
        return {"SLURM_CONF": str(self.conf)}

    def write_config(self) -> None:
        self.base.mkdir(mode=0o700, parents=True, exist_ok=True)
        for sub in ("munge", "state", "spool", "log", "run"):
            (self.base / sub).mkdir(mode=0o700, exist_ok=True)
        key = self.base / "munge" / "munge.key"
        key.write_bytes(secrets.token_bytes(128))
        key.chmod(0o600)
        lines = [
            "ClusterName=haicotest",
            f"SlurmctldPort={_free_port()}",
            f"SlurmdPort={_free_port()}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket},cred_expire=5",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/filetxt",
            f"JobCompLoc={self.jobcomp}",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "SchedulerParameters=batch_sched_delay=0,sched_interval=1,bf_interval=1",
            "DependencyParameters=kill_invalid_depend",
            # Slurm's default: a TERM reaches exit 75 in about a second idle, but in 5 s
            # (this setting before) not always on two cores under four test workers.
            "KillWait=30",
            "OverTimeLimit=0",
            "MinJobAge=300",
            "MailProg=/bin/true",
            "MpiDefault=none",
            "SwitchType=switch/none",
            "ReturnToService=2",
            f"StateSaveLocation={self.base / 'state'}",
            f"SlurmctldPidFile={self.base / 'run' / 'slurmctld.pid'}",
            f"SlurmctldLogFile={self.base / 'log' / 'slurmctld.log'}",
            *self.topology(),
        ]
        self.conf.write_text("\n".join(lines) + "\n")

    def topology(self) -> list[str]:
        """The controller's host, the slurmd files, the nodes and the partition: one node on
        loopback."""
        host = socket.gethostname().split(".")[0]
        return [
            f"SlurmctldHost={host}(127.0.0.1)",
            f"SlurmdSpoolDir={self.base / 'spool'}",
            f"SlurmdPidFile={self.base / 'run' / 'slurmd.pid'}",
            f"SlurmdLogFile={self.base / 'log' / 'slurmd.log'}",
            _node_line(),
            "PartitionName=debug Nodes=ALL Default=YES MaxTime=60 State=UP",
        ]

    def start(self, timeout: float = 30.0) -> None:
        """Write the config and start munged, slurmctld and the nodes; ready when every node
        is idle."""
        self.write_config()
        munge = self.base / "munge"
        subprocess.run(
            [
                "munged",
                "--force",
                f"--socket={self.munge_socket}",
                f"--key-file={munge / 'munge.key'}",
                f"--pid-file={munge / 'munged.pid'}",
                f"--log-file={munge / 'munged.log'}",
                f"--seed-file={munge / 'munged.seed'}",
            ],
            check=True,
            capture_output=True,
        )
        env = {**os.environ, **self.env}
        subprocess.run(["slurmctld"], env=env, check=True, capture_output=True)
        self.start_nodes()
        self.wait_idle(timeout)

    def start_nodes(self) -> None:
        subprocess.run(["slurmd"], env={**os.environ, **self.env}, check=True, capture_output=True)

    def wait_idle(self, timeout: float = 30.0) -> None:
        """Until sinfo shows every node idle; the daemon's log when one died meanwhile."""
        deadline = time.monotonic() + timeout
        while True:
            states = self.run("sinfo", "-h", "-N", "-o", "%T").stdout.split()
            if states and set(states) == {"idle"}:
                return
            for daemon, pid in self.daemon_pids().items():
                # No pid file yet is a daemon still starting; the deadline bounds that.
                if pid is not None and not is_alive(pid):
                    raise RuntimeError(f"{daemon} died at start:\n{self.log_tail(daemon)}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the nodes are {states}, not idle, after {timeout} s")
            time.sleep(0.1)

    def daemon_pids(self) -> dict[str, int | None]:
        """The Slurm daemons by name (slurmctld, then each node's slurmd): their pids."""
        return {"slurmctld": self._pid("slurmctld"), "slurmd": self._pid("slurmd")}

    def stop(self, grace: float = 15.0) -> None:
        """Stop every daemon by its PID file: SIGTERM, then SIGKILL after `grace` seconds."""
        pids = self.daemon_pids()
        for name in (*(name for name in pids if name != "slurmctld"), "slurmctld"):
            _terminate(pids[name], grace)
        _terminate(self._pid("munged"), grace)

    def run(self, *argv: str, check: bool = False) -> subprocess.CompletedProcess[str]:
        """A Slurm client command against this cluster."""
        return subprocess.run(
            argv, env={**os.environ, **self.env}, capture_output=True, text=True, check=check
        )

    def job_fields(self, job: str) -> dict[str, str]:
        """The job's ``scontrol -o show job`` fields (JobState, ExitCode, EndTime...) while the
        controller keeps it (MinJobAge); empty when it does not know the job."""
        lines = self.run("scontrol", "-o", "show", "job", job).stdout.splitlines()
        return _fields(lines[0]) if lines else {}

    def completion_fields(self, job: str) -> dict[str, str]:
        """The job completion log's (jobcomp/filetxt) last line for the job; empty if none.
        Its ExitCode is 0:0 for a CANCELLED or TIMEOUT job: `job_fields` has the real one."""
        if not self.jobcomp.exists():
            return {}
        lines = [
            line
            for line in self.jobcomp.read_text(errors="replace").splitlines()
            if line.startswith(f"JobId={job} ")
        ]
        return _fields(lines[-1]) if lines else {}

    def config_value(self, name: str) -> str:
        """A setting as the running controller reports it: ``KillWait`` -> ``30 sec``."""
        for line in self.run("scontrol", "show", "config", check=True).stdout.splitlines():
            key, sep, value = line.partition("=")
            if sep and key.strip() == name:
                return value.strip()
        raise KeyError(name)

    def processes_of_job(self, job: str) -> list[str]:
        """``PID: command line`` of every live process of this cluster's `job`, by its
        environment (SLURM_JOB_ID and SLURM_CONF, which every child inherits): the batch
        shell and everything it started, services included."""
        marks = {f"SLURM_JOB_ID={job}".encode(), f"SLURM_CONF={self.conf}".encode()}
        found = []
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                environ = set((proc / "environ").read_bytes().split(b"\0"))
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ")
            except OSError:
                continue
            if marks <= environ and is_alive(int(proc.name)):
                found.append(f"{proc.name}: {cmdline.decode(errors='replace')}")
        return found

    def wait_ended(self, *jobs: str, timeout: float = 240.0) -> dict[str, str]:
        """Task id ("12_0") -> state, once every task of `jobs` is in a final state. squeue
        names a job's passing flags as its state (SIGNALING while Slurm signals a running
        job, COMPLETING): only a final state is an end."""
        deadline = time.monotonic() + timeout
        ids = ",".join(jobs)
        while True:
            out = self.run("squeue", "-h", "-r", "-t", "all", "-j", ids, "-o", "%i %T").stdout
            states = dict(line.split() for line in out.splitlines() if line.strip())
            if states and all(state in FINAL_STATES for state in states.values()):
                return states
            if time.monotonic() > deadline:
                raise TimeoutError(f"jobs {ids} still {states} after {timeout} s")
            time.sleep(0.5)

    def log_tail(self, daemon: str, lines: int = 20) -> str:
        path = self.log_path(daemon)
        if not path.exists():
            return f"(no {path})"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def log_path(self, daemon: str) -> Path:
        return self.base / "log" / f"{daemon}.log"

    def _pid(self, daemon: str) -> int | None:
        path = (
            self.base / "munge" / "munged.pid"
            if daemon == "munged"
            else self.base / "run" / f"{daemon}.pid"
        )
        try:
            return int(path.read_text().strip())
        except (OSError, ValueError):
            return None


def _terminate(pid: int | None, grace: float) -> None:
    """SIGTERM to `pid`, then SIGKILL after `grace` seconds; nothing if it is not alive."""
    if pid is None or not is_alive(pid):
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while is_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if is_alive(pid):
        os.kill(pid, signal.SIGKILL)


def _fields(line: str) -> dict[str, str]:
    """``KEY=VALUE`` words of one Slurm record line."""
    return dict(word.split("=", 1) for word in line.split() if "=" in word)


def main(argv: list[str] | None = None) -> int:
    """`python -m tests.slurm.cluster DIR`: a private Slurm in DIR (made, mode 0700) until
    Ctrl-C or SIGTERM, for trying `haico submit` on one machine (as root, Slurm installed);
    it prints the SLURM_CONF to export in the shell that submits."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m tests.slurm.cluster", description=main.__doc__)
    parser.add_argument("directory", type=Path, help="where its config, state and logs go")
    args = parser.parse_args(argv)
    reason = missing_requirements()
    if reason is not None:
        print(f"cannot start a private Slurm here: {reason}", flush=True)
        return 2
    cluster = SlurmCluster(args.directory.absolute())
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        cluster.start()
        print(f"export SLURM_CONF={cluster.conf}    # then sinfo, haico submit ...", flush=True)
        print("a private Slurm of one node runs; Ctrl-C stops every daemon", flush=True)
        signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
