"""A stand-in for Slurm's client commands that keeps jobs between calls, for `haico submit`
and `haico continue` run as real processes: sbatch records each job (its name, array tasks,
argv) and answers a new id; squeue, scontrol and sacct answer from those records, whose
task states a test sets. No accounting and no job completion log, as on the private Slurm
of tests/slurm."""

from __future__ import annotations

import fcntl
import json
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The commands run this file with the interpreter of the tests.
_SCRIPT = Path(__file__).resolve()
_LIVE = {"PENDING", "RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED"}


@dataclass
class FakeSlurm:
    """The stand-in's state directory and the PATH that holds its commands."""

    root: Path

    @classmethod
    def install(cls, root: Path) -> FakeSlurm:
        (root / "jobs").mkdir(parents=True)
        (root / "bin").mkdir()
        for name in ("sbatch", "squeue", "scontrol", "scancel", "sacct", "sinfo"):
            command = root / "bin" / name
            command.write_text(
                f"#!{sys.executable}\nimport runpy\nrunpy.run_path({str(_SCRIPT)!r}, "
                f"init_globals={{'COMMAND': {name!r}, 'ROOT': {str(root)!r}}}, "
                "run_name='__main__')\n"
            )
            command.chmod(0o755)
        (root / "next").write_text("100")
        return cls(root)

    @property
    def path(self) -> str:
        return str(self.root / "bin")

    def jobs(self) -> dict[str, dict[str, Any]]:
        """Job id -> its record: name, tasks (task -> [state, exit code]), argv."""
        return {
            p.stem: json.loads(p.read_text()) for p in sorted((self.root / "jobs").glob("*.json"))
        }

    def named(self, fragment: str) -> list[str]:
        """The ids of the jobs whose name has `fragment`, in submission order."""
        return [i for i, job in self.jobs().items() if fragment in job["name"]]

    def end(
        self,
        job_id: str,
        task: int,
        state: str,
        code: str = "0:0",
        *,
        node: str | None = None,
        reason: str | None = None,
    ) -> None:
        """The task's state; `node`: the node its batch script ran on (BatchHost); `reason`:
        the Reason= of a pending task."""
        path = self.root / "jobs" / f"{job_id}.json"
        job = json.loads(path.read_text())
        job["tasks"][str(task)] = [state, code, node or "", reason or ""]
        path.write_text(json.dumps(job))

    def cancelled(self) -> list[str]:
        """The tasks `scancel` was asked to cancel (``<job>_<task>``), in order."""
        path = self.root / "scancelled"
        return path.read_text().split() if path.exists() else []

    def set_nodes(self, *nodes: str) -> None:
        """The nodes of the default partition, as ``sinfo -N`` lists them."""
        (self.root / "nodes").write_text("".join(f"{n} debug*\n" for n in nodes))

    def end_all(self, state: str = "COMPLETED", code: str = "0:0") -> None:
        for job_id, job in self.jobs().items():
            for task in job["tasks"]:
                self.end(job_id, int(task), state, code)


# -- the commands ------------------------------------------------------------------------


@contextmanager
def _locked(root: Path) -> Iterator[None]:
    with open(root / "lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _tasks(spec: str) -> list[int]:
    tasks: list[int] = []
    for part in spec.split(","):
        low, _, high = part.partition("-")
        tasks += range(int(low), int(high or low) + 1)
    return tasks


def _sbatch(root: Path, argv: list[str]) -> int:
    options = dict(arg[2:].split("=", 1) for arg in argv if arg.startswith("--") and "=" in arg)
    delay = root / "sbatch-delay"
    if delay.exists():
        time.sleep(float(delay.read_text()))
    with _locked(root):
        job_id = int((root / "next").read_text())
        (root / "next").write_text(str(job_id + 1))
        record = {
            "name": options.get("job-name", "sbatch"),
            "tasks": {str(t): ["PENDING", "0:0"] for t in _tasks(options.get("array", "0"))},
            "argv": argv,
        }
        (root / "jobs" / f"{job_id}.json").write_text(json.dumps(record))
    print(job_id)
    return 0


def _jobs(root: Path) -> dict[str, dict[str, Any]]:
    return {p.stem: json.loads(p.read_text()) for p in (root / "jobs").glob("*.json")}


def _squeue(root: Path, argv: list[str]) -> int:
    name = argv[argv.index("--name") + 1] if "--name" in argv else None
    for job_id, job in sorted(_jobs(root).items()):
        live = any(state in _LIVE for state, *_ in job["tasks"].values())
        if live and (name is None or job["name"] == name):
            print(job_id)
    return 0


def _scontrol(root: Path, argv: list[str]) -> int:
    if argv[:2] == ["show", "config"]:
        print("JobCompType             = jobcomp/none")
        return 0
    job = _jobs(root).get(argv[-1])
    if job is None:
        print("slurm_load_jobs error: Invalid job id specified", file=sys.stderr)
        return 1
    for task, (state, code, *more) in job["tasks"].items():
        node, reason = [*more, "", ""][:2]
        host = f" BatchHost={node}" if node else ""
        why = f" Reason={reason}" if reason else ""
        print(
            f"JobId={argv[-1]}{int(task):03d} ArrayJobId={argv[-1]} ArrayTaskId={task} "
            f"JobName={job['name']} JobState={state}{why} ExitCode={code}{host}"
        )
    return 0


def _main(command: str, root: Path) -> int:
    argv = sys.argv[1:]
    if command == "sbatch":
        return _sbatch(root, argv)
    if command == "squeue":
        return _squeue(root, argv)
    if command == "scontrol":
        return _scontrol(root, argv)
    if command == "scancel":
        job_id, _, task = argv[-1].partition("_")
        with _locked(root):
            with open(root / "scancelled", "a") as log:
                log.write(argv[-1] + "\n")
            path = root / "jobs" / f"{job_id}.json"
            job = json.loads(path.read_text())
            job["tasks"][task or "0"] = ["CANCELLED", "0:0"]
            path.write_text(json.dumps(job))
        return 0
    if command == "sinfo" and "-N" in argv:
        nodes = root / "nodes"
        print(nodes.read_text() if nodes.exists() else "node1 debug*", end="")
        return 0
    if command == "sinfo":
        print("debug* 1:00:00")
        return 0
    print("sacct: error: Slurm accounting storage is disabled", file=sys.stderr)
    return 1


if __name__ == "__main__":
    # Each command of `FakeSlurm.install` runs this file with its name and state directory.
    sys.exit(_main(globals()["COMMAND"], Path(globals()["ROOT"])))
