"""The chaos benchmark: a campaign on a private Slurm, random faults injected into its jobs
(and with --nodes, into their nodes), finished by `haico continue --until-done` alone.

Run (as root, where Slurm is installed; see .ci/run):
    .venv/bin/python benchmarks/chaos.py [--arms 3] [--items 50] [--seed 4] [--every 15-25]
    .venv/bin/python benchmarks/chaos.py --nodes 3

It starts munged, slurmctld and slurmd in a private directory (tests/slurm/cluster.py, the
Slurm tests' cluster: imported, not copied, as the editable install puts the repository on
sys.path; `--cluster DIR` uses one that runs already), writes a project of `--arms` arms
(the stand-in model and backend, the local profile inside each job) over `--items` scripts
of `--turns` turns each, runs `haico submit chaos --stage smoke` and `--stage full`, and
starts `haico continue chaos --until-done --every 1 --include-cancelled` once, as a user
would. While jobs run, every 15-25 s (seeded) one running task gets one fault: `scancel`,
`scancel --signal=USR1 --batch`, a TERM, USR1 or SIGKILL of its pytest, or its time limit
cut to now (`scontrol update EndTime=`: the TIMEOUT a walltime too short for the work
gives; a walltime merely short is no TIMEOUT, as the job's USR1 300 s ahead, its drain and
the walltime gate end it 75 first). No other command is run for the campaign. It stops when
the loop ends, or at `--bound` minutes (then the loop is stopped and the jobs cancelled).
A share (an arm's array index) that met k faults is spared its next task's first k x
`--spare` seconds (20): without that, a campaign's last task meets every fault, and on a
loaded machine, where a stack's start takes about as long as the interval, it is faulted
before it converses, round after round (a fault rate no cluster has).

With `--nodes N` the cluster is tests/slurm/nodes.py's: N compute nodes and a login node,
each a namespace. Submit and the loop run on the login node; arm chaos0 attaches by name to
its model, served by `haico serve` (from the login node) on a compute node; and the faults
include three of a running task's node: its slurmd killed, its network cut, a reboot (every
process killed, TMPDIR wiped). Each node heals as a cluster's does once the controller has
found it DOWN (and requeued its tasks): slurmd started again, the network restored. The
model's node is spared node faults, so that one node always remains that no fault made the
loop exclude. The kinds of the faults injected follow from the seed alone (a fault that
finds no target is tried again next time).

It prints the items with exactly one terminal record, lost and duplicated items, the share
of conversation time redone (formula printed), jobs, rounds, every task's end state, the
services left behind (with --nodes, any process on a node but its slurmd), the human
commands needed beyond submit and the loop (0, or the loop did not finish by itself), the
nodes the loop excluded (from the journal) and the faults per kind. Exit 0 when all of those
hold and at most `--max-redone` of the conversation time was redone, 1 otherwise; `--json
FILE` writes the figures for tests/slurm/test_chaos.py, which runs small versions.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from chaos_faults import FAULTS, NODE_FAULTS, Fault, Heal, JobWatch, NodeHealer, inject
from chaos_project import CAMPAIGN, SERVED_ARM, SERVED_EXPERIMENTS, write_project

from pytest_haico import Verdict
from pytest_haico.errors import CatalogueError
from pytest_haico.procfs import is_alive
from pytest_haico.serve.catalogue import read_entry
from tests.slurm.cluster import SlurmCluster, missing_requirements
from tests.slurm.nodes import LOGIN, MultiNodeCluster, missing_namespace_requirements

# The exit statuses a job may end with (docs/submit.md "Batch jobs"), with no signal.
JOB_EXITS = {0, 75, 78, 4}
POLL_S = 2.0
SERVICES_GONE_S = 10.0  # after the last job ended, what may still be exiting
# A run left on a healed node stops at its next record, or when its node's slurmd, back,
# is told its job went elsewhere.
NODE_SERVICES_GONE_S = 120.0
REGISTERED_S = 240.0  # for the served model's job to start and register
# What a compute node runs when nothing of the campaign is left on it.
NODE_DAEMONS = ("slurmd",)


@dataclass
class Summary:
    """What the benchmark found; `ok` when the campaign finished as it must."""

    items: int
    terminal_once: int
    lost: int
    duplicated: int
    redone_s: float
    recorded_s: float
    jobs: int
    tasks: int
    rounds: int
    loop_exit: int | None
    human_commands: int
    ends: dict[str, str]
    bad_ends: list[str]
    services_left: list[str]
    faults: dict[str, int]
    skipped_faults: int
    elapsed_s: float
    max_redone: float
    unreadable_lines: int = 0
    nodes: int = 1
    served_on: str | None = None  # the node of the served model (--nodes)
    exclusions: dict[str, list[str]] = field(default_factory=dict)  # job -> nodes excluded
    heals: dict[str, int] = field(default_factory=dict)  # node fault kind -> heals
    notes: list[str] = field(default_factory=list)

    @property
    def redone_share(self) -> float:
        return self.redone_s / self.recorded_s if self.recorded_s else 0.0

    @property
    def ok(self) -> bool:
        return (
            self.lost == 0
            and self.duplicated == 0
            and not self.bad_ends
            and not self.services_left
            and self.human_commands == 0
            and self.redone_share <= self.max_redone
        )


def haico_env(cluster: SlurmCluster) -> dict[str, str]:
    """This environment pointed at the cluster, without a job's Slurm variables or haico's
    settings (a benchmark started inside a job must not hand its own on)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SLURM_", "PYTEST_HAICO_")) and k != "CLUSTER_WORK"
    }
    return {**env, **cluster.env}


def haico_argv(cluster: SlurmCluster, root: Path, *args: str) -> list[str]:
    """`haico args` as a user runs it: on the login node of a multi-node cluster."""
    argv = [sys.executable, "-m", "pytest_haico", *args]
    return cluster.on(LOGIN, argv, cwd=root) if isinstance(cluster, MultiNodeCluster) else argv


def haico(
    cluster: SlurmCluster, root: Path, env: dict[str, str], *args: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        haico_argv(cluster, root, *args),
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def serve(cluster: MultiNodeCluster, root: Path, env: dict[str, str], *, minutes: int) -> str:
    """`haico serve` of the served arm from the login node; the node it registered from."""
    done = haico(
        cluster, root, env, "serve", SERVED_ARM, "--profile", "local", "--time", str(minutes),
        f"--experiments={root / SERVED_EXPERIMENTS}",
    )  # fmt: skip
    print(done.stdout, end="")
    if done.returncode != 0:
        raise SystemExit(f"haico serve: exit {done.returncode}\n{done.stdout}{done.stderr}")
    deadline = time.monotonic() + REGISTERED_S
    while True:
        with contextlib.suppress(CatalogueError, OSError, ValueError):
            return read_entry(root / "catalogue", SERVED_ARM).host
        if time.monotonic() > deadline:
            raise SystemExit(f"the served model did not register in {REGISTERED_S:g} s")
        time.sleep(POLL_S)


def run(options: argparse.Namespace, cluster: SlurmCluster, root: Path) -> Summary:
    began = time.monotonic()
    multi = cluster if isinstance(cluster, MultiNodeCluster) else None
    write_project(
        root,
        arms=options.arms,
        items=options.items,
        turns=options.turns,
        latency_ms=options.latency_ms,
        concurrency=options.concurrency,
        time_limit=options.time,
        served=multi is not None,
    )
    env = haico_env(cluster)
    served_on = None
    if multi is not None:
        env["TMPDIR"] = str(multi.tmpdir)
        served_on = serve(multi, root, env, minutes=min(60, math.ceil(options.bound) + 5))
        print(f"the served model {SERVED_ARM!r} registered on {served_on}")
    for stage in ("smoke", "full"):
        extra = ("--tasks", str(options.tasks)) if stage == "full" else ()
        submitted = haico(
            cluster, root, env, "submit", CAMPAIGN, "--stage", stage, "--profile", "local", *extra
        )
        print(submitted.stdout, end="")
        if submitted.returncode != 0:
            raise SystemExit(
                f"haico submit --stage {stage}: exit {submitted.returncode}\n" + submitted.stderr
            )
    loop_log = root / "until-done.log"
    with open(loop_log, "wb") as out:
        loop = subprocess.Popen(
            haico_argv(
                cluster,
                root,
                *("continue", CAMPAIGN, "--until-done", "--every", "1", "--include-cancelled"),
            ),
            cwd=root,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    watch = JobWatch(cluster, prefix=f"haico.{CAMPAIGN}.")
    healer = NodeHealer(multi, spared=served_on) if multi is not None else None
    faults: list[Fault] = []
    notes: list[str] = []
    try:
        _inject_until_done(
            loop, cluster, watch, options, healer, faults=faults, notes=notes, began=began,
            log=root,
        )  # fmt: skip
    finally:
        if loop.poll() is None:  # an error of the benchmark's own, or the bound
            os.killpg(loop.pid, signal.SIGTERM)
            loop.wait()
        if healer is not None:
            for heal in healer.heal_due(now_s=time.monotonic() - began, force=True):
                _log_heal(heal, root)
        if multi is not None:
            stopped = haico(cluster, root, env, "serve", "stop", SERVED_ARM)
            print(stopped.stdout, end="")
            if stopped.returncode != 0:
                notes.append(f"haico serve stop: exit {stopped.returncode}: {stopped.stderr}")
        watch.poll()
        leftover = watch.busy()
        if leftover:
            notes.append(f"cancelled {len(leftover)} task(s) still queued when the loop ended")
            cluster.run("scancel", *leftover)
        watch.wait_ended(timeout=180.0)
    loop_exit = loop.returncode
    loop_text = loop_log.read_text(errors="replace")
    print("--- haico continue --until-done (last 15 lines) ---")
    print("\n".join(loop_text.splitlines()[-15:]))
    return summarize(
        root,
        cluster,
        watch=watch,
        options=options,
        loop_text=loop_text,
        loop_exit=loop_exit,
        faults=faults,
        heals=healer.heals if healer else [],
        served_on=served_on,
        notes=notes,
        elapsed_s=time.monotonic() - began,
    )


def _inject_until_done(
    loop: subprocess.Popen[bytes],
    cluster: SlurmCluster,
    watch: JobWatch,
    options: argparse.Namespace,
    healer: NodeHealer | None,
    *,
    faults: list[Fault],
    notes: list[str],
    began: float,
    log: Path,
) -> None:
    """A fault every `options.every` seconds (seeded) until the loop ends or the bound; each
    poll heals the faulted nodes that are due."""
    rng = random.Random(options.seed)
    # The kinds from a stream of their own, drawn anew only once one is injected: the
    # kinds injected follow from the seed, whatever ran when.
    kinds_rng = random.Random(f"kinds-{options.seed}")
    kinds = sorted(FAULTS) + (sorted(NODE_FAULTS) if healer is not None else [])
    kind = kinds_rng.choice(kinds)
    low, high = options.every
    deadline = began + options.bound * 60
    next_fault = time.monotonic() + rng.uniform(low, high)
    hits: Counter[str] = Counter()
    while loop.poll() is None:
        if time.monotonic() > deadline:
            notes.append(f"the bound ({options.bound:g} min) stopped the loop")
            return
        watch.poll()
        if healer is not None:
            for heal in healer.heal_due(now_s=time.monotonic() - began):
                _log_heal(heal, log)
        if time.monotonic() >= next_fault:
            fault = inject(
                cluster,
                watch,
                rng,
                kind=kind,
                at_s=time.monotonic() - began,
                hits=hits,
                spare_s=options.spare,
                healer=healer,
            )
            faults.append(fault)
            print(f"fault {len(faults)}: {fault.line()}", flush=True)
            with open(log / "faults.jsonl", "a") as out:
                out.write(json.dumps(asdict(fault)) + "\n")
            if fault.hit:
                kind = kinds_rng.choice(kinds)
            next_fault = time.monotonic() + rng.uniform(low, high)
        time.sleep(POLL_S)


def _log_heal(heal: Heal, log: Path) -> None:
    print(f"heal: {heal.line()}", flush=True)
    with open(log / "faults.jsonl", "a") as out:
        out.write(json.dumps({"heal": asdict(heal)}) + "\n")


def summarize(
    root: Path,
    cluster: SlurmCluster,
    *,
    watch: JobWatch,
    options: argparse.Namespace,
    loop_text: str,
    loop_exit: int | None,
    faults: list[Fault],
    heals: list[Heal],
    served_on: str | None,
    notes: list[str],
    elapsed_s: float,
) -> Summary:
    terminal: Counter[tuple[str, str]] = Counter()
    redone = recorded = 0.0
    unreadable = 0
    for ledger in sorted((root / "results" / CAMPAIGN).glob("*/ledger/*.jsonl")):
        for line in ledger.read_text(errors="replace").splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                unreadable += 1  # a line torn by a kill: the tool's readers skip it too
                continue
            recorded += record["duration_s"]
            if Verdict(record["verdict"]).is_terminal:
                terminal[record["arm"], record["item_id"]] += 1
            else:
                redone += record["duration_s"]
    items = options.arms * options.items
    ends = watch.ends()
    bad = [f"{task} {end}" for task, end in ends.items() if not _allowed(end)]
    stopped = sum(
        line.startswith("haico: until-done: stopped at") for line in loop_text.splitlines()
    )
    # A loop that did not finish by itself leaves at least one command to a person.
    human = 0 if loop_exit == 0 else max(stopped, 1)
    return Summary(
        items=items,
        terminal_once=sum(1 for n in terminal.values() if n == 1),
        lost=items - len(terminal),
        duplicated=sum(1 for n in terminal.values() if n > 1),
        redone_s=redone,
        recorded_s=recorded,
        jobs=len({task.partition("_")[0] for task in ends}),
        tasks=len(ends),
        rounds=sum(line.startswith("haico: round ") for line in loop_text.splitlines()),
        loop_exit=loop_exit,
        human_commands=human,
        ends=ends,
        bad_ends=bad,
        services_left=services_left(root, cluster, watch),
        faults=dict(Counter(f.kind for f in faults if f.hit)),
        skipped_faults=sum(1 for f in faults if not f.hit),
        elapsed_s=elapsed_s,
        max_redone=options.max_redone,
        unreadable_lines=unreadable,
        nodes=len(cluster.compute) if isinstance(cluster, MultiNodeCluster) else 1,
        served_on=served_on,
        exclusions=exclusions(root),
        heals=dict(Counter(h.kind for h in heals)),
        notes=notes,
    )


def exclusions(root: Path) -> dict[str, list[str]]:
    """The nodes each continuation the loop planned was kept off, as its journal says."""
    found = {}
    for journal in sorted((root / "results" / CAMPAIGN).glob("submissions/*/journal.jsonl")):
        for line in journal.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError, KeyError, TypeError):
                entry = json.loads(line)
                if entry["state"] == "PREPARED" and entry["plan"].get("exclude"):
                    found[entry["job"]] = list(entry["plan"]["exclude"])
    return found


def _allowed(end: str) -> bool:
    """``FAILED 75:0`` ends well; ``FAILED 137:0`` or ``CANCELLED 0:9`` does not."""
    status, _, sig = end.partition(" ")[2].partition(":")
    return status.isdigit() and int(status) in JOB_EXITS and sig == "0"


def services_left(root: Path, cluster: SlurmCluster, watch: JobWatch) -> list[str]:
    """Processes of the campaign's jobs still alive (a bounded wait for the last to exit):
    by their job's environment, and the services every run registered."""
    deadline = time.monotonic() + SERVICES_GONE_S
    while True:
        alive = [p for job in watch.job_ids() for p in cluster.processes_of_job(job)]
        for registry in (root / "results" / CAMPAIGN).glob("*/runs/*/services.json"):
            with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                for service in json.loads(registry.read_text())["services"]:
                    if service["pid"] and is_alive(service["pid"], service.get("start_time")):
                        alive.append(f"{service['pid']}: {service.get('name')} of {registry}")
        if not alive or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    if isinstance(cluster, MultiNodeCluster):
        alive += processes_on_nodes(cluster)
    return alive


def processes_on_nodes(cluster: MultiNodeCluster) -> list[str]:
    """What runs on any node (in its namespace) but its slurmd, after a bounded wait."""
    deadline = time.monotonic() + NODE_SERVICES_GONE_S
    while True:
        left = [
            f"on {name}: {command}"
            for name in cluster.nodes
            for command in cluster.commands_on(name)
            if name == LOGIN or command.split(" ", 1)[0] not in NODE_DAEMONS
        ]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(1.0)


def report(summary: Summary, faults_path: Path) -> None:
    s = summary
    print("=== chaos benchmark ===")
    print(
        f"items: {s.items}; with exactly one terminal record: {s.terminal_once}; "
        f"lost: {s.lost}; duplicated: {s.duplicated}"
    )
    print(
        f"conversation time redone: {s.redone_share:.1%} = {s.redone_s:.0f} s / "
        f"{s.recorded_s:.0f} s (sum of duration_s of the non-terminal attempts: interrupted, "
        "infra_error, rate_limited / sum of duration_s of every recorded attempt; an attempt "
        "that a kill -9 cut leaves no record and is not in either sum)"
    )
    print(
        f"jobs: {s.jobs} ({s.tasks} tasks); rounds of --until-done: {s.rounds}; "
        f"its exit: {s.loop_exit}"
    )
    by_end = Counter(end for end in s.ends.values())
    print("end states: " + ", ".join(f"{end} x{n}" for end, n in sorted(by_end.items())))
    print("every task: " + ", ".join(f"{task} {end}" for task, end in s.ends.items()))
    print(f"ends outside 0/75/78/4: {s.bad_ends or 'none'}")
    print(f"services left behind: {s.services_left or 'none'}")
    if s.nodes > 1:
        print(f"nodes: {s.nodes}, the served model on {s.served_on} (spared node faults)")
        print(
            "nodes the loop excluded (journal): "
            + ("; ".join(f"{job}: {', '.join(n)}" for job, n in s.exclusions.items()) or "none")
        )
        print(f"node heals: {', '.join(f'{k} x{n}' for k, n in sorted(s.heals.items())) or 'none'}")
    print(
        f"faults injected: {sum(s.faults.values())} "
        f"({', '.join(f'{k} x{n}' for k, n in sorted(s.faults.items()))}); "
        f"skipped (no running task or pytest): {s.skipped_faults}; log {faults_path}"
    )
    print(f"redone within {s.max_redone:.0%}: {'yes' if s.redone_share <= s.max_redone else 'NO'}")
    if s.unreadable_lines:
        print(f"ledger lines unreadable (torn by a kill): {s.unreadable_lines}")
    for note in s.notes:
        print(f"note: {note}")
    print(f"human commands needed beyond submit and the loop: {s.human_commands}")
    print(f"({s.elapsed_s / 60:.1f} min in all): {'ok' if s.ok else 'NOT ok'}")


def _interval(text: str) -> tuple[float, float]:
    low, _, high = text.partition("-")
    pair = (float(low), float(high or low))
    if not 0 < pair[0] <= pair[1]:
        raise argparse.ArgumentTypeError(f"{text!r} is not an interval such as 15-25")
    return pair


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arms", type=int, default=3)
    parser.add_argument("--items", type=int, default=50, help="scripts, each run on every arm")
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--latency-ms", type=int, default=2000, help="per stand-in completion")
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--tasks", type=int, default=1, help="array tasks of the full stage")
    parser.add_argument("--time", default="00:08:00", help="the arms' walltime")
    parser.add_argument("--seed", type=int, default=4)
    parser.add_argument("--every", type=_interval, default=(15.0, 25.0), help="seconds, 15-25")
    parser.add_argument(
        "--spare",
        type=float,
        default=20.0,
        help="a share that met k faults is spared its next task's first k x SPARE seconds",
    )
    parser.add_argument("--bound", type=float, default=60.0, help="minutes until it gives up")
    parser.add_argument(
        "--max-redone", type=float, default=0.05, help="share of conversation time, 0.05"
    )
    parser.add_argument(
        "--nodes", type=int, default=0, help="a cluster of this many nodes and a login node"
    )
    parser.add_argument("--cluster", type=Path, help="a running private cluster's directory")
    parser.add_argument("--keep", type=Path, help="write the project here and keep it")
    parser.add_argument("--json", type=Path, help="write the figures to this file")
    options = parser.parse_args()
    # A TERM (a timeout's, a user's) unwinds like an error: the cluster is stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    reason = missing_requirements() or (missing_namespace_requirements() if options.nodes else None)
    if reason is not None:
        raise SystemExit(f"no real Slurm here: {reason}")
    if options.nodes and options.cluster is not None:
        parser.error("--nodes starts a cluster of its own: not with --cluster")
    with contextlib.ExitStack() as stack:
        if options.cluster is None:
            base = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="haico-chaos-")))
            cluster = (
                MultiNodeCluster(base / "cluster", count=options.nodes)
                if options.nodes
                else SlurmCluster(base / "cluster")
            )
            cluster.start()
            stack.callback(cluster.stop)
        else:
            cluster = SlurmCluster(options.cluster)
        root = options.keep or Path(
            stack.enter_context(tempfile.TemporaryDirectory(prefix="haico-chaos-project-"))
        )
        summary = run(options, cluster, root)
        report(summary, root / "faults.jsonl")
        if options.json is not None:
            options.json.write_text(
                json.dumps(
                    {**asdict(summary), "ok": summary.ok, "redone_share": summary.redone_share}
                )
            )
        if options.keep is None and not summary.ok:
            kept = Path(tempfile.mkdtemp(prefix="haico-chaos-kept-"))
            shutil.copytree(root, kept, symlinks=True, dirs_exist_ok=True)
            print(f"the project is kept in {kept}")
    sys.exit(0 if summary.ok else 1)


if __name__ == "__main__":
    main()
