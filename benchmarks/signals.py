"""The kill-survival paths through the full local stack: USR1 drain and TERM with 16
conversations in flight, and what periodic pg_dumps cost a campaign.

Run: python benchmarks/signals.py [--repeat N] [--part all|usr1|term|dumps|early]

* USR1: 32 one-turn scripts that ask for a document on an arm at concurrency 16 whose
  stand-in model holds every request that goes on with a conversation (persona hang: the
  tool's result never gets an answer); once the model server has logged 16 held
  requests, SIGUSR1 goes to
  pytest, run with --haico-drain-timeout 5 --haico-dump-interval 0, and the time to its
  exit is taken. Budget: the drain timeout + that run's final dump + 2 s, and exit 75. The
  final dump is timed in the same run, from the moment its pg_dump process is a child of
  pytest to the moment `final-*.dump` is in place (fsynced and renamed), both polled every
  20 ms from the signal on. A pg_dump timed apart would dump another database at another
  moment, and the difference with a drain ended by a second USR1 would carry the noise of
  two runs. The phases are shown: signal -> final pg_dump, the dump, dump -> exit, and
  when the services were last seen alive.
* TERM: the same campaign, SIGTERM to pytest alone (what `kill` does); then to pytest and
  every process under it, as Slurm does at the walltime (Postgres then refuses new
  connections). Budget: 3 s to exit, exit 75, no final dump. The phases are shown: signal
  -> every conversation in flight recorded interrupted (in the ledger), -> the services
  last seen alive, -> exit. Under Slurm all of it must fit in KillWait (30 s by default,
  5 s in tests/slurm) on a loaded node. (Measured with timing probes on this machine, idle:
  of 0.95 s, pytest's rendering of the interrupt's traceback took 0.48 s, every entry
  with its source and arguments; the handler now cuts a SIGTERM's traceback to the entry
  pytest prints. Then 0.35 s stopping the stack, of which the stand-ins' own shutdown
  0.25 s, and 0.12 s the interpreter's exit.)
* dumps: 192 conversations x 2 turns, 250 ms completions, 16 in flight, with
  --haico-dump-interval 5 and 0, N runs of each interleaved in alternating pairs (AB BA
  ...) so a drift in the shared machine's load moves both. Budget: ratio of the medians
  <= 1.05, for the whole process and for the campaign span (first conversation's start to
  last one's end, from the ledger), the span being the stricter.

* early: a signal in a run's first seconds (benchmarks/signals_early.py).

Every run is a fresh project in a temporary directory. Figures past their budget are
reported, never asserted: the exit status is 0 unless a run could not be measured.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from signals_early import early

from pytest_haico.procfs import is_alive

IN_FLIGHT = 16
HANG_SCRIPTS = 32  # more than in flight: the rest must not start after the signal
DRAIN_TIMEOUT_S = 5.0
DRAIN_SLACK_S = 2.0
TERM_BUDGET_S = 3.0
EXIT_CODE = 75
DUMP_INTERVAL_S = 5.0
DUMP_COST_BUDGET = 1.05
CONVERSATIONS = 192
TURNS = 2
LATENCY_MS = 250
SIGNAL_POLL_S = 0.02  # from the signal to the exit
CAMPAIGN_POLL_S = 0.05  # the periodic dumps of a whole campaign
READY_POLL_S = 0.05
READY_TIMEOUT_S = 180.0
EXIT_TIMEOUT_S = 120.0  # then the run is killed and reported
HANG_LINE = "persona hang holds the request"

HANGING_ARM = f"""
[run]
concurrency = {IN_FLIGHT}
turn_timeout_s = 600
[standin]
persona = "hang"
"""
CAMPAIGN_ARM = f"[run]\nconcurrency = {IN_FLIGHT}\n[standin]\nlatency_ms = {LATENCY_MS}\n"
TEST_MODULE = """
from pytest_haico import Verdict


def test_conversation(haico_conversation):
    assert haico_conversation.verdict is Verdict.COMPLETED, haico_conversation.explain()
"""
# Plugins that are not ours: langsmith's (from the stand-ins' LangChain) costs only at
# start-up, which is not measured here; hypothesis's is a test dependency of this repository,
# not of a campaign's environment, and its terminal summary alone takes over a second at exit.
PYPROJECT = (
    '[tool.pytest.ini_options]\nasyncio_default_fixture_loop_scope = "function"\n'
    'addopts = "-p no:langsmith_plugin -p no:hypothesispytest"\n'
)


class BenchmarkError(Exception):
    """A run that could not be measured (it ended early, or never got ready)."""


# A turn that makes the model call a tool: persona hang then holds the turn's next request.
ARTIFACT_ASK = "Write it up as a document (conversation {i})."
QUESTION = "question {t} of conversation {i}"


def write_project(
    root: Path, arm: str, *, conversations: int, turns: int, ask: str = QUESTION
) -> None:
    experiments = root / "experiments"
    (experiments / "arms").mkdir(parents=True)
    (experiments / "scripts").mkdir()
    (root / "pyproject.toml").write_text(PYPROJECT)
    (experiments / "arms" / "bench.toml").write_text(arm)
    lines = []
    for i in range(conversations):
        script_turns = [{"user": ask.format(t=t, i=i)} for t in range(turns)]
        lines.append(json.dumps({"id": f"c{i:04d}", "turns": script_turns}))
    (experiments / "scripts" / "bench.jsonl").write_text("\n".join(lines) + "\n")
    (experiments / "test_conversations.py").write_text(TEST_MODULE)


def campaign_env() -> dict[str, str]:
    """This environment without a Slurm job's variables and haico settings: a benchmark
    started inside a job must not inherit the job's walltime or results directory."""
    return {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SLURM_", "PYTEST_HAICO_")) and k != "CLUSTER_WORK"
    }


# -- processes, from /proc ------------------------------------------------------------


def children(pid: int) -> list[int]:
    # Plain os calls: this runs every 20 ms over each of pytest's threads.
    found: list[int] = []
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with (
                contextlib.suppress(OSError),
                open(f"/proc/{pid}/task/{task}/children", "rb") as handle,
            ):
                found += [int(c) for c in handle.read().split()]
    return found


def descendants(pid: int) -> list[int]:
    found: list[int] = []
    todo = children(pid)
    while todo:
        child = todo.pop()
        found.append(child)
        todo += children(child)
    return found


def dump_kind(pid: int) -> str | None:
    """`final` or `periodic` if `pid` is a pg_dump of the plugin's (from its --file name)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return None
    if not argv or Path(argv[0]).name != "pg_dump":
        return None  # also a child forked but not yet exec'd: looked at again next poll
    for arg in argv:
        if arg.startswith("--file="):
            return Path(arg.removeprefix("--file=")).name.lstrip(".").split("-")[0]
    return "?"


def service_pids(arm_dir: Path) -> list[int]:
    """The service processes the arm's runs registered (none while a registry is written)."""
    pids: list[int] = []
    for registry in arm_dir.glob("runs/*/services.json"):
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            pids += [s["pid"] for s in json.loads(registry.read_text())["services"] if s["pid"]]
    return pids


def interrupted_records(arm_dir: Path) -> int:
    """The arm's ledger lines recording an interrupted attempt (a torn last line is not)."""
    count = 0
    for ledger in arm_dir.glob("ledger/*.jsonl"):
        with contextlib.suppress(OSError):
            count += ledger.read_bytes().count(b'"verdict":"interrupted"')
    return count


@dataclass
class DumpSeen:
    kind: str
    first: float
    last: float


class RunWatch(threading.Thread):
    """Every `poll_s`: the pg_dump processes pytest starts (kind, first and last seen), when
    a final dump is in place, and when one of `services` was last alive (perf_counter)."""

    def __init__(
        self, pytest_pid: int, arm_dir: Path, *, services: list[int], poll_s: float
    ) -> None:
        super().__init__(name="run-watch", daemon=True)
        self._pid = pytest_pid
        self._arm_dir = arm_dir
        self._services = services
        self._poll_s = poll_s
        self._stop_event = threading.Event()
        self.seen: dict[int, DumpSeen] = {}
        self.final_in_place: float | None = None
        self.service_last_alive: float | None = None
        self.interrupted_recorded: float | None = None  # when `expect_interrupted` were
        self.expect_interrupted = 0

    def run(self) -> None:
        while not self._stop_event.is_set():
            now = time.perf_counter()
            for child in children(self._pid):
                if child in self.seen:
                    self.seen[child].last = now
                elif (kind := dump_kind(child)) is not None:
                    self.seen[child] = DumpSeen(kind, now, now)
            if self.final_in_place is None and any(self._arm_dir.glob("runs/*/dumps/final-*")):
                self.final_in_place = now
            if any(is_alive(pid) for pid in self._services):
                self.service_last_alive = now
            if (
                self.expect_interrupted
                and self.interrupted_recorded is None
                and interrupted_records(self._arm_dir) >= self.expect_interrupted
            ):
                self.interrupted_recorded = now
            self._stop_event.wait(self._poll_s)

    def stop(self) -> None:
        self._stop_event.set()
        if self.is_alive():
            self.join()

    def dumps(self, kind: str) -> list[DumpSeen]:
        return sorted((d for d in self.seen.values() if d.kind == kind), key=lambda d: d.first)


# -- one pytest process over a campaign ---------------------------------------------------


class CampaignRun:
    """pytest over the project in `root`, in its own session, its output in a log file."""

    def __init__(self, root: Path, *args: str) -> None:
        self.root = root
        self.log = root / "pytest.log"
        self.arm_dir = root / "results" / "default" / "bench"
        command = [sys.executable, "-u", "-m", "pytest", "experiments", "-q"]
        command += ["-p", "no:cacheprovider", *args]
        with open(self.log, "wb") as out:
            self.started = time.perf_counter()
            self.process = subprocess.Popen(
                command,
                cwd=root,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=campaign_env(),
                start_new_session=True,  # a Ctrl-C meant for the benchmark spares it
            )
        self.watch: RunWatch | None = None

    def start_watch(self, *, services: list[int], poll_s: float) -> RunWatch:
        self.watch = RunWatch(self.process.pid, self.arm_dir, services=services, poll_s=poll_s)
        self.watch.start()
        return self.watch

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_until(self, condition: Callable[[], bool], *, what: str) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not condition():
            if self.process.poll() is not None and not condition():
                raise BenchmarkError(
                    f"pytest ended (exit {self.process.returncode}) before {what}:\n"
                    + self.output()[-3000:]
                )
            if time.monotonic() > deadline:
                raise BenchmarkError(f"no {what} after {READY_TIMEOUT_S:.0f} s")
            time.sleep(READY_POLL_S)

    def wait_exit(self) -> tuple[int, float]:
        """The exit status and when it came (perf_counter); killed after EXIT_TIMEOUT_S."""
        watchdog = threading.Timer(EXIT_TIMEOUT_S, self._give_up)
        watchdog.start()
        try:
            returncode = self.process.wait()
        finally:
            watchdog.cancel()
        ended = time.perf_counter()
        if self.watch is not None:
            self.watch.stop()
        return returncode, ended

    def _give_up(self) -> None:
        """The watchdog: keep the project (its log, results and service logs) for a
        post-mortem, then kill the run."""
        kept = Path(tempfile.mkdtemp(prefix="haico-signals-kept-"))
        with contextlib.suppress(OSError, shutil.Error):
            shutil.copytree(self.root, kept, symlinks=True, dirs_exist_ok=True)
        print(
            f"  pytest (pid {self.process.pid}) did not exit within {EXIT_TIMEOUT_S:.0f} s: "
            f"killed; its project is kept in {kept}",
            file=sys.stderr,
        )
        self.kill()

    def kill(self) -> None:
        """pytest and every process under it, by pid: a run that failed half-way."""
        for pid in [self.process.pid, *descendants(self.process.pid)]:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)

    def close(self) -> None:
        if self.process.poll() is None:
            self.kill()
            self.process.wait()
        if self.watch is not None:
            self.watch.stop()

    # -- what it left in results/ ---------------------------------------------------------

    def hanging_requests(self) -> int:
        return sum(
            log.read_text(errors="replace").count(HANG_LINE)
            for log in self.arm_dir.glob("runs/*/logs/llm.log")
        )

    def records(self) -> list[dict[str, str]]:
        return [
            json.loads(line)
            for ledger in self.arm_dir.glob("ledger/*.jsonl")
            for line in ledger.read_text().splitlines()
            if line.strip()
        ]


# -- the signal paths -------------------------------------------------------------------


@dataclass(frozen=True)
class SignalResult:
    exit_s: float
    returncode: int
    in_flight: int  # held requests when the signal was sent
    interrupted: int
    other_records: str  # the other verdicts and their counts, '-' for none
    final_dumps: int
    services_left: int
    dump_start_s: float | None  # signal -> the final pg_dump seen
    dump_s: float | None  # the final pg_dump seen -> final-*.dump in place
    services_s: float | None  # signal -> the last service last seen alive
    recorded_s: float | None  # signal -> every conversation in flight recorded interrupted


def signal_run(signum: signal.Signals, *, tree: bool = False) -> SignalResult:
    with tempfile.TemporaryDirectory(prefix="haico-signals-") as tmp:
        root = Path(tmp)
        write_project(root, HANGING_ARM, conversations=HANG_SCRIPTS, turns=1, ask=ARTIFACT_ASK)
        drain = f"{DRAIN_TIMEOUT_S:g}"
        run = CampaignRun(root, "--haico-drain-timeout", drain, "--haico-dump-interval", "0")
        try:
            run.wait_until(
                lambda: run.hanging_requests() >= IN_FLIGHT,
                what=f"{IN_FLIGHT} conversations in flight",
            )
            in_flight = run.hanging_requests()
            # Started only now: polling every 20 ms costs some 4% of a core.
            watch = run.start_watch(services=service_pids(run.arm_dir), poll_s=SIGNAL_POLL_S)
            if signum is signal.SIGTERM:
                watch.expect_interrupted = in_flight
            targets = [run.process.pid, *(descendants(run.process.pid) if tree else [])]
            sent = time.perf_counter()
            for pid in targets:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signum)
            returncode, ended = run.wait_exit()
        finally:
            run.close()
        verdicts = [r["verdict"] for r in run.records()]
        finals = watch.dumps("final")
        gone = watch.service_last_alive
        dump_start_s = dump_s = None
        if finals and watch.final_in_place is not None:
            dump_start_s = finals[0].first - sent
            dump_s = watch.final_in_place - finals[0].first
        return SignalResult(
            exit_s=ended - sent,
            returncode=returncode,
            in_flight=in_flight,
            interrupted=verdicts.count("interrupted"),
            other_records=", ".join(
                f"{v} x{n}" for v, n in Counter(verdicts).items() if v != "interrupted"
            )
            or "-",
            final_dumps=len(list(run.arm_dir.glob("runs/*/dumps/final-*.dump"))),
            services_left=sum(1 for pid in service_pids(run.arm_dir) if is_alive(pid)),
            dump_start_s=dump_start_s,
            dump_s=dump_s,
            services_s=None if gone is None else gone - sent,
            recorded_s=None
            if watch.interrupted_recorded is None
            else watch.interrupted_recorded - sent,
        )


def verdict(within: bool) -> str:
    return "within" if within else "OVER"


def figures(values: list[float]) -> str:
    return "[" + ", ".join(f"{v:.3f}" for v in values) + "]"


def report_common(results: list[SignalResult]) -> None:
    codes = [r.returncode for r in results]
    ok = "ok" if all(c == EXIT_CODE for c in codes) else f"NOT all {EXIT_CODE}"
    print(f"  exit codes {codes} (must be {EXIT_CODE}): {ok}")
    print(
        f"  in flight at the signal {[r.in_flight for r in results]}; recorded interrupted "
        f"{[r.interrupted for r in results]}, other records "
        f"[{'; '.join(r.other_records for r in results)}]; services alive after exit "
        f"{[r.services_left for r in results]}"
    )
    stopped = [r for r in results if r.services_s is not None]
    if stopped:
        last = [r.services_s or 0.0 for r in stopped]
        rest = [r.exit_s - s for r, s in zip(stopped, last, strict=True)]
        print(
            f"  signal -> services last seen alive {statistics.median(last):.3f} s "
            f"{figures(last)}, then -> exit {statistics.median(rest):.3f} s"
        )


def usr1(repeat: int) -> None:
    results = [signal_run(signal.SIGUSR1) for _ in range(repeat)]
    print(
        f"USR1 with {IN_FLIGHT} in flight, --haico-drain-timeout {DRAIN_TIMEOUT_S:g} "
        f"(medians of {repeat})"
    )
    exits = [r.exit_s for r in results]
    dumped = [r for r in results if r.dump_s is not None and r.dump_start_s is not None]
    if len(dumped) < len(results):
        print(f"  {len(results) - len(dumped)} run(s) wrote no final dump (budget unknown)")
    budgets = [DRAIN_TIMEOUT_S + (r.dump_s or 0.0) + DRAIN_SLACK_S for r in dumped]
    within = sum(r.exit_s <= b for r, b in zip(dumped, budgets, strict=True))
    print(f"  USR1 -> exit {statistics.median(exits):.3f} s  {figures(exits)}")
    if dumped:
        dumps = [r.dump_s or 0.0 for r in dumped]
        starts = [r.dump_start_s or 0.0 for r in dumped]
        tails = [r.exit_s - s - d for r, s, d in zip(dumped, starts, dumps, strict=True)]
        budget = statistics.median(budgets)
        print(
            f"  budget {DRAIN_TIMEOUT_S:g} s drain + final dump + {DRAIN_SLACK_S:g} s = "
            f"{budget:.3f} s (median): {verdict(statistics.median(exits) <= budget)}; "
            f"each run within its own budget: {within} of {len(results)}"
        )
        print(
            f"  phases: USR1 -> final pg_dump starts {statistics.median(starts):.3f} s, final "
            f"dump {statistics.median(dumps):.3f} s {figures(dumps)}, dump in place -> exit "
            f"{statistics.median(tails):.3f} s"
        )
    report_common(results)


def term(repeat: int) -> None:
    for tree, whom in ((False, "pytest alone"), (True, "pytest and every process under it")):
        results = [signal_run(signal.SIGTERM, tree=tree) for _ in range(repeat)]
        exits = [r.exit_s for r in results]
        median = statistics.median(exits)
        print(f"TERM to {whom}, {IN_FLIGHT} in flight (medians of {repeat})")
        print(
            f"  TERM -> exit {median:.3f} s  {figures(exits)}  budget {TERM_BUDGET_S:g} s: "
            f"{verdict(median <= TERM_BUDGET_S)}; each run within: "
            f"{sum(e <= TERM_BUDGET_S for e in exits)} of {len(exits)}"
        )
        print(f"  final dumps written {[r.final_dumps for r in results]} (must be 0)")
        recorded = [r.recorded_s for r in results if r.recorded_s is not None]
        if recorded:
            print(
                f"  TERM -> every conversation in flight recorded interrupted "
                f"{statistics.median(recorded):.3f} s {figures(recorded)}"
            )
        report_common(results)


# -- the cost of periodic dumps -------------------------------------------------------------


@dataclass(frozen=True)
class CampaignResult:
    elapsed_s: float
    span_s: float
    returncode: int
    periodic_s: list[float]  # how long each periodic pg_dump ran


def campaign_run(interval_s: float) -> CampaignResult:
    with tempfile.TemporaryDirectory(prefix="haico-signals-") as tmp:
        root = Path(tmp)
        write_project(root, CAMPAIGN_ARM, conversations=CONVERSATIONS, turns=TURNS)
        run = CampaignRun(root, "--haico-dump-interval", f"{interval_s:g}")
        watch = run.start_watch(services=[], poll_s=CAMPAIGN_POLL_S)
        try:
            returncode, ended = run.wait_exit()
        finally:
            run.close()
        if returncode != 0:
            print(f"  exit {returncode}:\n{run.output()[-3000:]}", file=sys.stderr)
        records = run.records()
        if not records:
            raise BenchmarkError(f"no ledger records under {run.arm_dir}")
        first = min(datetime.fromisoformat(r["started_at"]).timestamp() for r in records)
        last = max(datetime.fromisoformat(r["finished_at"]).timestamp() for r in records)
        return CampaignResult(
            elapsed_s=ended - run.started,
            span_s=last - first,
            returncode=returncode,
            periodic_s=[d.last - d.first for d in watch.dumps("periodic")],
        )


def dump_cost(repeat: int) -> None:
    print(
        f"{CONVERSATIONS} conversations x {TURNS} turns, {LATENCY_MS} ms completions, "
        f"{IN_FLIGHT} in flight, with and without --haico-dump-interval {DUMP_INTERVAL_S:g} "
        f"(medians of {repeat}, alternating pairs)"
    )
    variants = {0.0: "without", DUMP_INTERVAL_S: "with"}
    results: dict[float, list[CampaignResult]] = {interval: [] for interval in variants}
    for pair in range(repeat):
        order = list(variants) if pair % 2 == 0 else list(variants)[::-1]
        for interval in order:
            results[interval].append(campaign_run(interval))
    medians: dict[float, tuple[float, float]] = {}
    for interval, runs in results.items():
        whole = [r.elapsed_s for r in runs]
        span = [r.span_s for r in runs]
        medians[interval] = (statistics.median(whole), statistics.median(span))
        print(
            f"  {variants[interval]:>7} (interval {interval:g}): whole process "
            f"{medians[interval][0]:.3f} s {figures(whole)}, campaign {medians[interval][1]:.3f} "
            f"s {figures(span)}; exit codes {[r.returncode for r in runs]}"
        )
    periodic = results[DUMP_INTERVAL_S]
    durations = [d for r in periodic for d in r.periodic_s]
    each = f", each {statistics.median(durations):.3f} s (median)" if durations else ""
    print(f"  periodic pg_dumps per run {[len(r.periodic_s) for r in periodic]}{each}")
    (whole_0, span_0), (whole_5, span_5) = medians[0.0], medians[DUMP_INTERVAL_S]
    for what, ratio in (("whole process", whole_5 / whole_0), ("campaign span", span_5 / span_0)):
        print(
            f"  ratio with/without, {what}: {ratio:.3f} (budget <= {DUMP_COST_BUDGET}): "
            f"{verdict(ratio <= DUMP_COST_BUDGET)}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--repeat", "--repeats", type=int, default=3, help="runs of each figure (default 3)"
    )
    parser.add_argument("--part", choices=("all", "usr1", "term", "dumps", "early"), default="all")
    args = parser.parse_args()
    parts: dict[str, Callable[[int], None]] = {
        "usr1": usr1,
        "term": term,
        "dumps": dump_cost,
        "early": early,
    }
    failed = False
    began = time.perf_counter()
    for name, part in parts.items():
        if args.part not in ("all", name):
            continue
        before = os.getloadavg()[0]
        try:
            part(args.repeat)
        except BenchmarkError as exc:
            print(f"{name}: could not be measured: {exc}")
            failed = True
        # The figures mean little when other work held the cores.
        print(
            f"  load average {before:.1f} before, {os.getloadavg()[0]:.1f} after "
            f"({os.cpu_count()} cores)"
        )
    print(f"({time.perf_counter() - began:.0f} s in all)")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
