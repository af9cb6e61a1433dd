"""The chaos benchmark's faults and its watch over the campaign's Slurm tasks (chaos.py): job
faults on a task, and on a multi-node cluster node faults on a task's node, each healed as a
cluster heals (`NodeHealer`)."""

from __future__ import annotations

import math
import os
import random
import signal
import time
from collections import Counter
from dataclasses import dataclass
from datetime import datetime

from pytest_haico.slurm.timelimits import parse_time_limit
from tests.slurm.cluster import SlurmCluster
from tests.slurm.nodes import SLURMD_TIMEOUT, MultiNodeCluster

# A fault and what it does to one running task (docs/submit.md "Batch jobs" says how each ends).
FAULTS = {
    "scancel": "scancel",
    "usr1-batch": "scancel --signal=USR1 --batch",
    "term": "SIGTERM to its pytest",
    "usr1": "SIGUSR1 to its pytest",
    "kill-9": "SIGKILL to its pytest",
    "cut": "time limit cut to now (scontrol update EndTime=)",
}
# A fault of the node a running task is on (--nodes), and how the node heals once the
# controller has found it DOWN (the task requeued): as an admin, systemd or a reboot would.
NODE_FAULTS = {
    "slurmd-kill": ("its node's slurmd killed", "slurmd started again"),
    "net-cut": ("its node's network cut", "network restored"),
    "reboot": ("its node rebooted (processes killed, TMPDIR wiped)", "slurmd started again"),
}
# A node that is not DOWN this long after its fault is healed anyway (and said so).
HEAL_AFTER_S = SLURMD_TIMEOUT * 4
_PYTEST_SIGNALS = {"term": signal.SIGTERM, "usr1": signal.SIGUSR1, "kill-9": signal.SIGKILL}
_BUSY = {"PENDING", "RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED", "REQUEUED"}


@dataclass(frozen=True)
class Fault:
    """One fault as it was injected, or why none was (`hit` false)."""

    at_s: float  # since the benchmark began
    kind: str
    task: str  # "12_0", "" when no task was running
    name: str
    pid: int | None  # the pytest signalled
    hit: bool
    detail: str

    def line(self) -> str:
        what = FAULTS[self.kind] if self.kind in FAULTS else NODE_FAULTS[self.kind][0]
        if not self.task:
            return f"at {self.at_s:.0f} s: {what}: none, {self.detail}"
        pid = f" (pid {self.pid})" if self.pid else ""
        state = "" if self.hit else " - not injected"
        return (
            f"at {self.at_s:.0f} s: {what}{pid}, task {self.task} {self.name}: {self.detail}{state}"
        )


class JobWatch:
    """The tasks of the jobs named `prefix...`, as the controller shows them, polled: what
    each ended as survives its record (the controller forgets a job MinJobAge after)."""

    def __init__(self, cluster: SlurmCluster, *, prefix: str) -> None:
        self._cluster = cluster
        self._prefix = prefix
        self._tasks: dict[str, dict[str, str]] = {}

    def poll(self) -> None:
        out = self._cluster.run("scontrol", "-o", "show", "job").stdout
        # The pending rest of an array ("14_1-3") is one record that shrinks as tasks start:
        # only this poll's stands, unless it ended so (a dependency never met).
        for label in [t for t in self._tasks if not _single(t) and t in self.busy()]:
            del self._tasks[label]
        for line in out.splitlines():
            fields = dict(w.split("=", 1) for w in line.split() if "=" in w)
            if not fields.get("JobName", "").startswith(self._prefix):
                continue
            task = fields.get("ArrayTaskId")
            label = f"{fields['ArrayJobId']}_{task}" if task else fields["JobId"]
            self._tasks[label] = fields

    def running(self) -> list[str]:
        return sorted(t for t, f in self._tasks.items() if f.get("JobState") == "RUNNING")

    def run_seconds(self, task: str) -> float:
        """How long the task has run, as the controller said at the last poll."""
        return parse_time_limit(self._tasks[task].get("RunTime", "0")) or 0.0

    def share(self, task: str) -> str:
        """The arm and array index a task runs (``chaos0.work_1``), the same in every round:
        job names are ``haico.<campaign>.<submission>.<stage or round>.<arm>``."""
        arm = ".".join(self.name(task).split(".")[4:])
        return f"{arm}_{self._tasks[task].get('ArrayTaskId', '0')}"

    def busy(self) -> list[str]:
        return sorted(t for t, f in self._tasks.items() if f.get("JobState") in _BUSY)

    def name(self, task: str) -> str:
        return self._tasks[task].get("JobName", "")

    def node(self, task: str) -> str:
        """The node the task runs on (its batch host)."""
        return self._tasks[task].get("BatchHost", "")

    def job_id(self, task: str) -> str:
        return self._tasks[task]["JobId"]

    def job_ids(self) -> list[str]:
        return [f["JobId"] for f in self._tasks.values()]

    def ends(self) -> dict[str, str]:
        """Task -> ``STATE EXIT:SIGNAL`` of every task seen, in order of submission."""
        order = sorted(
            self._tasks, key=lambda t: [int(p) if p.isdigit() else -1 for p in t.split("_")]
        )
        return {t: f"{self._tasks[t]['JobState']} {self._tasks[t]['ExitCode']}" for t in order}

    def wait_ended(self, *, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        self.poll()
        while self.busy() and time.monotonic() < deadline:
            time.sleep(1.0)
            self.poll()


def _single(task: str) -> bool:
    return task.replace("_", "").isdigit()


def pytest_pid(cluster: SlurmCluster, job_id: str) -> int | None:
    """The campaign pytest of a running job (the batch script's child), if it started."""
    for process in cluster.processes_of_job(job_id):
        pid, _, command = process.partition(": ")
        words = command.split()
        if " -m pytest " in f" {command} " and any(w.startswith("--haico-exit") for w in words):
            return int(pid)
    return None


def inject(
    cluster: SlurmCluster,
    watch: JobWatch,
    rng: random.Random,
    *,
    kind: str,
    at_s: float,
    hits: Counter[str],
    spare_s: float,
    healer: NodeHealer | None = None,
) -> Fault:
    """One fault of `kind` to a random running task (or, for a node fault, its node), sparing
    a task whose share met k faults before its first k x `spare_s` seconds (`hits` counts
    them and is updated: for a node fault, every task on the node)."""
    tasks = watch.running()
    running = [t for t in tasks if watch.run_seconds(t) >= hits[watch.share(t)] * spare_s]
    if kind in NODE_FAULTS:
        assert healer is not None
        running = [t for t in running if healer.may_fault(watch.node(t))]
    if not running:
        why = "no task running" + (" that is not spared" if tasks else "")
        return Fault(at_s, kind, "", "", None, False, why)
    task = rng.choice(running)
    if kind in NODE_FAULTS:
        assert healer is not None
        node = watch.node(task)
        healer.fault(node, kind, at_s=at_s)
        for other in tasks:
            if watch.node(other) == node:
                hits[watch.share(other)] += 1
        return Fault(at_s, kind, task, watch.name(task), None, True, f"node {node}")
    fault = _hit(cluster, watch, task, kind, at_s=at_s)
    if fault.hit:
        hits[watch.share(task)] += 1
    return fault


@dataclass(frozen=True)
class Heal:
    """A faulted node healed."""

    at_s: float
    node: str
    kind: str  # the fault it heals
    after_s: float  # since the fault
    down: bool  # whether the controller had found the node DOWN by then

    def line(self) -> str:
        how = NODE_FAULTS[self.kind][1]
        seen = "found DOWN" if self.down else f"not DOWN after {HEAL_AFTER_S} s"
        return f"at {self.at_s:.0f} s: node {self.node} {seen}: {how} ({self.after_s:.0f} s on)"


class NodeHealer:
    """The node faults in progress on a multi-node cluster and their heals: a faulted node
    heals once the controller has found it DOWN (its tasks requeued), or after
    `HEAL_AFTER_S`. The `spared` node (the served model's) is never faulted, so that a node
    always remains that no fault made the campaign exclude."""

    def __init__(self, cluster: MultiNodeCluster, *, spared: str | None) -> None:
        self._cluster = cluster
        self._spared = spared
        self._faulted: dict[str, tuple[str, float]] = {}  # node -> (kind, at_s)
        self.heals: list[Heal] = []

    def may_fault(self, node: str) -> bool:
        return bool(node) and node != self._spared and node not in self._faulted

    def fault(self, node: str, kind: str, *, at_s: float) -> None:
        if kind == "slurmd-kill":
            self._cluster.kill_slurmd(node)
        elif kind == "net-cut":
            self._cluster.cut_network(node)
        else:
            self._cluster.power_off(node)
        self._faulted[node] = (kind, at_s)

    def heal_due(self, *, now_s: float, force: bool = False) -> list[Heal]:
        """Heal each faulted node that is DOWN, or faulted `HEAL_AFTER_S` ago (every one
        with `force`); the heals made."""
        made = []
        for node, (kind, at_s) in list(self._faulted.items()):
            down = self._cluster.state(node).rstrip("*") == "down"
            if not (down or force or now_s - at_s >= HEAL_AFTER_S):
                continue
            if kind == "net-cut":
                self._cluster.restore_network(node)
            else:
                self._cluster.start_slurmd(node)
            del self._faulted[node]
            made.append(Heal(now_s, node, kind, now_s - at_s, down))
        self.heals += made
        return made


def _hit(cluster: SlurmCluster, watch: JobWatch, task: str, kind: str, *, at_s: float) -> Fault:
    name = watch.name(task)
    if kind in _PYTEST_SIGNALS:
        pid = pytest_pid(cluster, watch.job_id(task))
        if pid is None:
            return Fault(at_s, kind, task, name, None, False, "its pytest has not started")
        try:
            os.kill(pid, _PYTEST_SIGNALS[kind])
        except ProcessLookupError:
            return Fault(at_s, kind, task, name, pid, False, "its pytest had just ended")
        return Fault(at_s, kind, task, name, pid, True, "sent")
    if kind == "cut":
        end = datetime.fromtimestamp(math.ceil(time.time() + 1)).isoformat(timespec="seconds")
        argv = ["scontrol", "update", f"JobId={task}", f"EndTime={end}"]
    else:
        argv = ["scancel", *FAULTS[kind].split()[1:], task]
    done = cluster.run(*argv)
    said = (done.stdout + done.stderr).strip()
    return Fault(
        at_s,
        kind,
        task,
        name,
        None,
        done.returncode == 0,
        f"{' '.join(argv)}: exit {done.returncode}{': ' + said if said else ''}",
    )
