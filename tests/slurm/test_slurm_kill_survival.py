"""Kill survival under real Slurm daemons, judged by what is on disk afterwards: a campaign that
outlasts its walltime, its resubmission, `scancel --signal=USR1 --batch`, a plain `scancel`,
and walltime admission.

Each campaign is one arm of the local profile whose stand-in model answers every request after
`latency_ms`, so a script's number of turns sets how long its conversation stays in flight:
one `long` script holds a slot while one-turn `short` scripts pass through the others. One
campaign goes through three jobs in a row, as a user's would: it runs into its walltime, the
same command finishes it, and a two-minute job on the scripts added since admits only what
its remaining time covers, by the item times the first two measured.

The walltime job and TIMEOUT. Slurm checks time limits every 30 s; `--signal=B:USR1@30` comes
at the first check where the end time is at most 30 + 30 s away, TERM at the first check past
it, SIGKILL KillWait later. A drain that ends before the end time lets pytest exit 75, and the
job is then FAILED 75:0, never TIMEOUT: TIMEOUT needs pytest still running at the end time.
So the job drains with `--haico-drain-timeout 90`, longer than the 30-60 s from USR1 to TERM,
and its long conversation outlasts both. Once a short one has completed, the test moves the
end time to 31-32 s ahead (`scontrol update EndTime=`): USR1 comes at the next check (0-30 s
later), TERM at the first check past the end time, 30 s after USR1 (60 s when USR1's check
came within 2 s of the update), so the long conversation (34 turns of 2 s, started ~2.5 s
before the update) is still in flight at TERM. What each signal did is then on disk: USR1
started the drain (nothing new started; the short conversations in flight completed), TERM
recorded the long one `interrupted` and pytest exited 75 within KillWait; Slurm recorded
TIMEOUT. TERM is the emergency path, which writes no final dump, so the newest periodic dump
(`--haico-dump-interval`) is what survives: a TIMEOUT and a final dump cannot both be.
"""

from __future__ import annotations

import json
import math
import re
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from pytest_haico.durations import format_duration
from pytest_haico.procfs import is_alive
from tests.harness import CONVERSATION_MODULE, clear_campaign_environment
from tests.polling import wait_for
from tests.signals.conftest import dumps, restorable
from tests.slurm.cluster import SlurmCluster

REPO = Path(__file__).resolve().parents[2]
WRAPPER = REPO / "sbatch" / "campaign.sbatch"
ARM = "demo"
# squeue states of a job that may still run or still has processes.
NOT_ENDED = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SIGNALING", "SUSPENDED"}

# The walltime job: --haico-drain-timeout longer than USR1 -> TERM (30-60 s), and a long
# conversation (>= 68 s) that outlasts both; see the module docstring.
WALLTIME_SBATCH = ("--job-name=ks-walltime", "--time=5", "--signal=B:USR1@30")
WALLTIME_PYTEST = ("--haico-drain-timeout", "90", "--haico-dump-interval", "10")
WALLTIME_SHORT = 40

# The campaign projects' pytest settings: the harness's, and no hypothesis plugin. A dev tool
# of this venv, not of a campaign, its terminal summary imports all of hypothesis (2-4 s on
# two busy cores), after SIGTERM too, which outlasted a KillWait of 5 s: the
# job then ends by SIGKILL (exit 0:9) with every record already on disk.
PYPROJECT = """\
[tool.pytest.ini_options]
addopts = ["-p", "no:langsmith_plugin", "-p", "no:hypothesispytest"]
asyncio_default_fixture_loop_scope = "function"
"""


@dataclass(frozen=True)
class Campaign:
    """A campaign project with one arm (`demo`), run from its own directory."""

    root: Path
    scripts: tuple[str, ...]  # script ids, in collection order

    @property
    def arm_dir(self) -> Path:
        return self.root / "results" / "default" / ARM

    def run_dir(self, job: str) -> Path:
        """The run directory of `job`'s run (its first and only pytest run)."""
        return self.arm_dir / "runs" / f"{job}.1"

    def log(self, job: str) -> str:
        path = self.root / f"job-{job}.out"
        return path.read_text(errors="replace") if path.exists() else f"(no {path.name})"

    def record_count(self) -> int:
        """Complete lines in the arm's ledgers so far (a run may be writing one)."""
        return sum(p.read_bytes().count(b"\n") for p in (self.arm_dir / "ledger").glob("*.jsonl"))

    def records(self) -> list[dict[str, Any]]:
        """Every record of the arm's ledgers, in file order. The ledgers must be intact: every
        file ends with a whole line and every line parses."""
        records = []
        for path in sorted((self.arm_dir / "ledger").glob("*.jsonl")):
            data = path.read_bytes()
            assert data.endswith(b"\n"), f"{path.name} ends in a torn line: {data[-200:]!r}"
            for number, line in enumerate(data.splitlines(), 1):
                try:
                    records.append(json.loads(line))
                except ValueError as exc:
                    pytest.fail(f"{path.name}:{number} does not parse ({exc}): {line[:200]!r}")
        return records

    def untranscribed(self, job: str) -> list[str]:
        """Scripts whose completed record from `job`'s run has no transcript file."""
        return [
            r["script"]
            for r in self.records()
            if r["run_id"] == f"{job}.1"
            and r["verdict"] == "completed"
            and not (
                self.arm_dir / "transcripts" / f"{r['item_id']}.{r['run_id']}.{r['attempt']}.jsonl"
            ).is_file()
        ]

    def verdicts(self, job: str) -> dict[str, str]:
        """Script -> verdict of the records `job`'s run wrote: one record per item."""
        mine = [r for r in self.records() if r["run_id"] == f"{job}.1"]
        counts = Counter(r["script"] for r in mine)
        assert max(counts.values(), default=1) == 1, f"an item recorded twice: {counts}"
        return {r["script"]: r["verdict"] for r in mine}


def write_scripts(path: Path, scripts: Sequence[tuple[str, str, int]]) -> None:
    """A JSONL script file of (script id, stratum, turns) scripts. No turn asks for an
    artifact, so each is exactly one plain model request."""
    lines = [
        json.dumps(
            {
                "id": sid,
                "stratum": stratum,
                "turns": [{"user": f"hello {sid}, turn {n}"} for n in range(turns)],
            }
        )
        for sid, stratum, turns in scripts
    ]
    path.write_text("\n".join(lines) + "\n")


def write_campaign(
    root: Path, *, latency_ms: int, concurrency: int, scripts: Sequence[tuple[str, str, int]]
) -> Campaign:
    """A campaign of (script id, stratum, turns) scripts whose model answers after
    `latency_ms`; the arm keeps `concurrency` conversations in flight."""
    experiments = root / "experiments"
    (experiments / "arms").mkdir(parents=True)
    (experiments / "scripts").mkdir()
    (experiments / "arms" / f"{ARM}.toml").write_text(
        f"[run]\nconcurrency = {concurrency}\nturn_timeout_s = 600\n"
        f"[standin]\nlatency_ms = {latency_ms}\n"
    )
    write_scripts(experiments / "scripts" / "items.jsonl", scripts)
    (experiments / "test_conversations.py").write_text(CONVERSATION_MODULE)
    (root / "pyproject.toml").write_text(PYPROJECT)
    return Campaign(root, tuple(sid for sid, _, _ in scripts))


def long_and_short(root: Path, *, latency_ms: int, long_turns: int, shorts: int) -> Campaign:
    """One long conversation first, then `shorts` one-turn ones; three in flight at a time,
    so the long one holds a slot from the start while the short ones pass the other two."""
    scripts = [("long", "long", long_turns)]
    scripts += [(f"short{i:02d}", "short", 1) for i in range(shorts)]
    return write_campaign(root, latency_ms=latency_ms, concurrency=3, scripts=scripts)


def add_scripts(
    campaign: Campaign, filename: str, scripts: Sequence[tuple[str, str, int]]
) -> Campaign:
    """The campaign grown by a script file of (script id, stratum, turns) scripts."""
    write_scripts(campaign.root / "experiments" / "scripts" / filename, scripts)
    return Campaign(campaign.root, campaign.scripts + tuple(sid for sid, _, _ in scripts))


@dataclass
class Jobs:
    """Submits `sbatch/campaign.sbatch` to the cluster; `cancel_all` ends what still runs."""

    cluster: SlurmCluster
    submitted: list[str] = field(default_factory=list)

    def submit(
        self,
        campaign: Campaign,
        sbatch: Sequence[str],
        pytest_args: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
    ) -> str:
        exports = "".join(f",{name}={value}" for name, value in (env or {}).items())
        result = self.cluster.run(
            "sbatch",
            "--parsable",
            f"--chdir={campaign.root}",
            f"--export=ALL,HAICO_PYTHON={sys.executable}{exports}",
            "--output=job-%j.out",
            *sbatch,
            str(WRAPPER),
            "experiments",
            *pytest_args,
            check=True,
        )
        job = result.stdout.strip().split(";")[0]
        self.submitted.append(job)
        return job

    def successor(self, campaign: Campaign, job: str) -> str:
        """The chain link `job` queued to continue it (HAICO_CHAIN), cancelled at the end."""
        found = re.search(r"haico: chain: queued job (\d+) to continue", campaign.log(job))
        assert found, campaign.log(job)
        self.submitted.append(found[1])
        return found[1]

    def state(self, job: str) -> str:
        return self.cluster.run("squeue", "-h", "-t", "all", "-j", job, "-o", "%T").stdout.strip()

    def wait_ended(self, job: str, *, timeout: float) -> str:
        """The job's final state, once it has no process left (not COMPLETING)."""
        state = ""

        def ended() -> bool:
            nonlocal state
            state = self.state(job)
            return state != "" and state not in NOT_ENDED

        wait_for(ended, timeout=timeout, what=f"job {job} to end")
        return state

    def cancel_all(self) -> None:
        for job in self.submitted:
            if self.state(job) in NOT_ENDED:
                self.cluster.run("scancel", job)


@pytest.fixture
def jobs(slurm_cluster: SlurmCluster, monkeypatch: pytest.MonkeyPatch) -> Iterator[Jobs]:
    """Submits campaign jobs from an environment without Slurm job or PYTEST_HAICO_
    variables; jobs still running at teardown are cancelled."""
    clear_campaign_environment(monkeypatch)
    submitted = Jobs(slurm_cluster)
    try:
        yield submitted
    finally:
        submitted.cancel_all()


def service_pids(run_dir: Path) -> dict[str, int]:
    """Service name -> PID from the run's services.json (only while its stack runs)."""
    registry = json.loads((run_dir / "services.json").read_text())
    return {s["name"]: s["pid"] for s in registry["services"] if s.get("pid")}


def wait_while_running(
    jobs: Jobs, campaign: Campaign, job: str, condition: Callable[[], bool], *, what: str
) -> None:
    """Poll `condition`; fail at once, with the job's log, if the job ends first."""
    checked = time.monotonic()

    def holds() -> bool:
        nonlocal checked
        if condition():
            return True
        if time.monotonic() - checked < 1:  # squeue at most once a second
            return False
        checked = time.monotonic()
        state = jobs.state(job)
        if state in NOT_ENDED or condition():
            return False
        pytest.fail(f"job {job} ended ({state}) before {what}:\n{campaign.log(job)}")

    wait_for(holds, timeout=120, what=f"{what} (job {job})")


def wait_for_services(jobs: Jobs, campaign: Campaign, job: str) -> dict[str, int]:
    """The PIDs of the job's postgres, llm and backend, once its stack has started them."""
    services: dict[str, int] = {}

    def listed() -> bool:
        nonlocal services
        try:
            services = service_pids(campaign.run_dir(job))
        except (OSError, ValueError):
            return False
        return {"postgres", "llm", "backend"} <= services.keys()

    wait_while_running(jobs, campaign, job, listed, what="its services in services.json")
    return services


def wait_for_records(jobs: Jobs, campaign: Campaign, job: str, count: int) -> None:
    wait_while_running(
        jobs, campaign, job, lambda: campaign.record_count() >= count, what=f"{count} record(s)"
    )


def nothing_left(cluster: SlurmCluster, job: str, services: dict[str, int]) -> None:
    """No process of the job is left: not the services it ran, nor anything else."""
    alive = {name: pid for name, pid in services.items() if is_alive(pid)}
    assert alive == {}, f"services of job {job} still alive: {alive}"
    assert cluster.processes_of_job(job) == []


def end_time_in(seconds: float) -> str:
    """An `scontrol update EndTime=` value at least `seconds` from now (whole seconds)."""
    return datetime.fromtimestamp(math.ceil(time.time() + seconds)).isoformat(timespec="seconds")


def left_s(duration: str) -> int:
    """Seconds of a duration as the summary prints it: ``45 s``, ``1 min 50 s``."""
    found = re.fullmatch(r"(?:(\d+) min )?(\d+) s", duration)
    assert found is not None, duration
    return int(found[1] or 0) * 60 + int(found[2])


def summary_groups(log: str, pattern: str) -> tuple[str, ...]:
    """The groups of the one summary line matching `pattern` (a regex)."""
    found = re.findall(pattern, log)
    assert len(found) == 1, f"{pattern!r} matched {len(found)} time(s) in:\n{log}"
    match = found[0]
    return match if isinstance(match, tuple) else (match,)


# -- the walltime, then the same command again ------------------------------------------------


@dataclass(frozen=True)
class Ran:
    """A job of the walltime campaign, and the PIDs of its services while its stack ran."""

    job: str
    state: str
    services: dict[str, int]


@dataclass(frozen=True)
class Walltime:
    """The walltime campaign, its job that ran into TIMEOUT, and who submits its next jobs."""

    campaign: Campaign
    jobs: Jobs
    timed_out: Ran
    successor: str  # the chain's next link, queued by the timed-out job


@pytest.fixture(scope="module")
def walltime(
    slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Walltime]:
    """A campaign job killed at its walltime: submitted with `--signal=B:USR1@30` as the first
    of a two-link chain (HAICO_CHAIN=1), its end time moved to 31-32 s ahead once a short
    conversation completed (see the module docstring)."""
    root = tmp_path_factory.mktemp("walltime") / "project"
    # 34 turns of >= 2 s: >= 68 s, past TERM (at most 62 s after the end time is moved,
    # itself ~2.5 s after the long conversation started).
    campaign = long_and_short(root, latency_ms=2000, long_turns=34, shorts=WALLTIME_SHORT)
    with pytest.MonkeyPatch.context() as patch:
        clear_campaign_environment(patch)
        jobs = Jobs(slurm_cluster)
        try:
            # A command-line --signal is not in the job's record: the chain passes it on as
            # SBATCH_SIGNAL, as docs/submit.md says.
            chain = {"HAICO_CHAIN": "1", "SBATCH_SIGNAL": "B:USR1@30"}
            job = jobs.submit(campaign, WALLTIME_SBATCH, WALLTIME_PYTEST, env=chain)
            services = wait_for_services(jobs, campaign, job)
            wait_for_records(jobs, campaign, job, 1)
            slurm_cluster.run(
                "scontrol", "update", f"JobId={job}", f"EndTime={end_time_in(31)}", check=True
            )
            state = jobs.wait_ended(job, timeout=150)
            successor = jobs.successor(campaign, job)
            yield Walltime(campaign, jobs, Ran(job, state, services), successor)
        finally:
            jobs.cancel_all()


@pytest.fixture(scope="module")
def resubmitted(walltime: Walltime) -> Ran:
    """The chain's next link, which Slurm started once the first ended TIMEOUT, run to its
    end: the timed-out job's command again, with nobody resubmitting it by hand."""
    campaign, jobs, job = walltime.campaign, walltime.jobs, walltime.successor
    services = wait_for_services(jobs, campaign, job)
    return Ran(job, jobs.wait_ended(job, timeout=180), services)


def test_walltime_job_times_out_with_every_item_recorded_interrupted_or_not_started(
    slurm_cluster: SlurmCluster, walltime: Walltime
) -> None:
    campaign, job = walltime.campaign, walltime.timed_out.job
    log = campaign.log(job)
    fields = slurm_cluster.job_fields(job)
    assert (walltime.timed_out.state, fields["JobState"]) == ("TIMEOUT", "TIMEOUT"), log
    assert slurm_cluster.completion_fields(job)["JobState"] == "TIMEOUT"
    # pytest handled TERM and exited 75 within KillWait: no SIGKILL (that would be 0:9).
    assert fields["ExitCode"] == "75:0", log

    # USR1 started the drain, then TERM ended it at the walltime.
    usr1 = log.index("haico: SIGUSR1: draining: nothing new starts;")
    term = log.index(
        "haico: SIGTERM: the job is being ended (walltime, scancel, preemption): what is in "
        "flight is recorded interrupted now; no final dump"
    )
    assert usr1 < term
    assert f"*** JOB {job} ON " in log and " DUE TO TIME LIMIT ***" in log

    # Every item is accounted for: completed, interrupted (the long one, cut by TERM), or
    # not started (no record).
    verdicts = campaign.verdicts(job)
    assert verdicts.pop("long") == "interrupted", log
    assert set(verdicts.values()) == {"completed"}, log
    not_started = [s for s in campaign.scripts if s != "long" and s not in verdicts]
    assert not_started, "every short item ran: the drain never stopped admitting"
    assert campaign.untranscribed(job) == []
    tally = f"1 recorded interrupted, {len(not_started)} not started"
    assert (
        "terminated (exit 75): SIGTERM: the job is being ended (walltime, scancel, "
        f"preemption); {tally}; no final dump (the newest periodic dump is the last)"
    ) in log
    (in_flight,) = summary_groups(
        log,
        r"drained \(exit 75\): SIGUSR1: draining: (\d+) conversation\(s\) in flight were given "
        rf"--haico-drain-timeout 90 s, cut short by SIGTERM; {tally}",
    )
    assert 1 <= int(in_flight) <= 3

    # No final dump (TERM); the newest periodic one survives, whole.
    run = campaign.run_dir(job)
    assert dumps(run, "final") == []
    (periodic,) = dumps(run, "periodic")
    assert restorable(periodic)
    assert [p.name for p in (run / "dumps").iterdir() if p.name.startswith(".")] == []
    nothing_left(slurm_cluster, job, walltime.timed_out.services)


def test_the_chain_continues_the_timed_out_job_and_finishes_the_rest_nothing_twice(
    slurm_cluster: SlurmCluster, walltime: Walltime, resubmitted: Ran
) -> None:
    campaign, first, again = walltime.campaign, walltime.timed_out.job, resubmitted.job
    log = campaign.log(again)
    assert resubmitted.state == "COMPLETED", log
    assert slurm_cluster.job_fields(again)["ExitCode"] == "0:0"
    assert re.search(rf"haico: chain: job {first} ended TIMEOUT\b.*: continuing it", log), log
    assert "haico: chain: the last link, no successor" in log
    before = campaign.verdicts(first)
    done = sum(1 for v in before.values() if v == "completed")
    assert f"haico: {done} done in ledger, {len(campaign.scripts) - done} to run" in log

    # One terminal record per item over both jobs; the long one was tried again.
    history: dict[str, list[tuple[str, str]]] = {}
    for record in campaign.records():
        history.setdefault(record["script"], []).append((record["run_id"], record["verdict"]))
    assert history.pop("long") == [(f"{first}.1", "interrupted"), (f"{again}.1", "completed")]
    assert sorted(history) == sorted(s for s in campaign.scripts if s != "long")
    assert all(len(h) == 1 and h[0][1] == "completed" for h in history.values()), history
    assert {s for s, h in history.items() if h[0][0] == f"{again}.1"} == {
        s for s in campaign.scripts if s not in before
    }
    assert campaign.untranscribed(again) == []

    (final,) = dumps(campaign.run_dir(again), "final")
    assert restorable(final)
    assert len(dumps(campaign.run_dir(first), "periodic")) == 1  # an earlier run's dump stays
    nothing_left(slurm_cluster, again, resubmitted.services)


# -- scancel --signal=USR1 --batch ------------------------------------------------------------


def test_scancel_usr1_batch_drains_and_exits_75_with_a_restorable_final_dump(
    slurm_cluster: SlurmCluster, jobs: Jobs, tmp_path: Path
) -> None:
    # One-turn items take ~1 s and finish within the 5 s drain; the long one (30 s) does not.
    campaign = long_and_short(tmp_path / "project", latency_ms=1000, long_turns=30, shorts=20)
    job = jobs.submit(campaign, ["--job-name=ks-usr1", "--time=10"], ["--haico-drain-timeout", "5"])
    services = wait_for_services(jobs, campaign, job)
    wait_for_records(jobs, campaign, job, 2)
    slurm_cluster.run("scancel", "--signal=USR1", "--batch", job, check=True)
    state = jobs.wait_ended(job, timeout=90)
    log = campaign.log(job)
    assert state == "FAILED", log
    assert slurm_cluster.job_fields(job)["ExitCode"] == "75:0", log
    assert "haico: SIGUSR1: draining: nothing new starts;" in log
    assert "haico: SIGTERM" not in log

    verdicts = campaign.verdicts(job)
    assert verdicts.pop("long") == "interrupted", log
    assert set(verdicts.values()) == {"completed"}, log  # the drain let them finish
    not_started = [s for s in campaign.scripts if s != "long" and s not in verdicts]
    assert not_started, log
    assert campaign.untranscribed(job) == []
    (in_flight,) = summary_groups(
        log,
        r"drained \(exit 75\): SIGUSR1: draining: (\d+) conversation\(s\) in flight were given "
        rf"--haico-drain-timeout 5 s, then cancelled; 1 recorded interrupted, "
        rf"{len(not_started)} not started",
    )
    assert 1 <= int(in_flight) <= 3

    run = campaign.run_dir(job)
    (final,) = dumps(run, "final")
    assert restorable(final)
    nothing_left(slurm_cluster, job, services)


# -- scancel: TERM to every process of the job ------------------------------------------------


def test_scancel_records_what_is_in_flight_interrupted_and_the_job_is_gone_within_killwait(
    slurm_cluster: SlurmCluster, jobs: Jobs, tmp_path: Path
) -> None:
    campaign = long_and_short(tmp_path / "project", latency_ms=1000, long_turns=30, shorts=20)
    job = jobs.submit(campaign, ["--job-name=ks-scancel", "--time=10"], [])
    services = wait_for_services(jobs, campaign, job)
    wait_for_records(jobs, campaign, job, 2)
    slurm_cluster.run("scancel", job, check=True)
    state = jobs.wait_ended(job, timeout=60)
    log = campaign.log(job)
    assert state == "CANCELLED", log
    # pytest ended the job itself (75), before the SIGKILL that follows KillWait (0:9).
    assert slurm_cluster.job_fields(job)["ExitCode"] == "75:0", log

    verdicts = campaign.verdicts(job)  # the ledger is intact: every line parses
    assert verdicts["long"] == "interrupted", log
    interrupted = [s for s, v in verdicts.items() if v == "interrupted"]
    assert set(verdicts.values()) == {"completed", "interrupted"}, log
    not_started = [s for s in campaign.scripts if s not in verdicts]
    assert not_started, log
    assert (
        "terminated (exit 75): SIGTERM: the job is being ended (walltime, scancel, "
        f"preemption); {len(interrupted)} recorded interrupted, {len(not_started)} not "
        "started; no final dump"
    ) in log
    assert dumps(campaign.run_dir(job), "final") == []
    nothing_left(slurm_cluster, job, services)


# -- walltime admission -----------------------------------------------------------------------


def test_a_job_too_short_for_a_stratum_admits_only_what_fits_and_exits_75(
    slurm_cluster: SlurmCluster, walltime: Walltime, resubmitted: Ran, jobs: Jobs
) -> None:
    # The earlier ledgers are the walltime campaign's: a long item took T >= 68 s, short
    # ones ~2 s. The campaign grows by two scripts of each stratum, and a two-minute job
    # with --haico-drain-timeout 40 has 80-115 s left once its stack is up: enough for a
    # short item (2 s + 70 s margin), never for a long one (T + 70 s).
    assert resubmitted.state == "COMPLETED", walltime.campaign.log(resubmitted.job)
    measured = [
        r["duration_s"]
        for r in walltime.campaign.records()
        if r["stratum"] == "long" and r["verdict"] == "completed"
    ]
    assert len(measured) == 1
    # Admission goes by the stratum; one turn each keeps a wrong admission short.
    added = [("short-new0", "short", 1), ("short-new1", "short", 1)]
    added += [("long-new0", "long", 1), ("long-new1", "long", 1)]
    campaign = add_scripts(walltime.campaign, "more.jsonl", added)

    # --signal=B:USR1@1: Slurm sends it at the first check within 1 + 30 s of the end, 89 s
    # or more after the start, once this job has ended.
    job = jobs.submit(
        campaign,
        ["--job-name=ks-admission", "--time=2", "--signal=B:USR1@1"],
        ["--haico-drain-timeout", "40"],
    )
    services = wait_for_services(jobs, campaign, job)  # the stack started
    state = jobs.wait_ended(job, timeout=90)
    log = campaign.log(job)
    assert state == "FAILED", log
    assert slurm_cluster.job_fields(job)["ExitCode"] == "75:0", log
    assert "SIGUSR1" not in log
    (left,) = summary_groups(
        log,
        rf"stopped admitting \(exit 75\): job {job} ends in (.+?); items of stratum long "
        rf"take {re.escape(format_duration(measured[0]))} \(p95 of 1\) \+ 70 s drain margin: "
        r"not admitting; 0 recorded interrupted, 2 not started",
    )
    assert left_s(left) < measured[0] + 70
    # What fitted ran; the long items have no record.
    assert campaign.verdicts(job) == {"short-new0": "completed", "short-new1": "completed"}
    assert not {"long-new0", "long-new1"} & {r["script"] for r in campaign.records()}
    nothing_left(slurm_cluster, job, services)
