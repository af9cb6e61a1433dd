"""The chaos benchmark's faults and its watch over the campaign's Slurm tasks (chaos.py)."""

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

# A fault and what it does to one running task (docs/submit.md "Batch jobs" says how each ends).
FAULTS = {
    "scancel": "scancel",
    "usr1-batch": "scancel --signal=USR1 --batch",
    "term": "SIGTERM to its pytest",
    "usr1": "SIGUSR1 to its pytest",
    "kill-9": "SIGKILL to its pytest",
    "cut": "time limit cut to now (scontrol update EndTime=)",
}
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
        what = FAULTS[self.kind]
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
    at_s: float,
    hits: Counter[str],
    spare_s: float,
) -> Fault:
    """One fault of a random kind to a random running task, sparing a task whose share met
    k faults before its first k x `spare_s` seconds (`hits` counts them and is updated)."""
    kind = rng.choice(sorted(FAULTS))
    tasks = watch.running()
    running = [t for t in tasks if watch.run_seconds(t) >= hits[watch.share(t)] * spare_s]
    if not running:
        why = "no task running" + (" that is not spared" if tasks else "")
        return Fault(at_s, kind, "", "", None, False, why)
    task = rng.choice(running)
    fault = _hit(cluster, watch, task, kind, at_s=at_s)
    if fault.hit:
        hits[watch.share(task)] += 1
    return fault


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
