"""Walltime admission: the job's end time from Slurm, item times from the ledgers, the refusal."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from pathlib import Path

import pytest

from pytest_haico.ledger.item_times import ItemTime, ItemTimes
from pytest_haico.ledger.records import LedgerRecord, record_line
from pytest_haico.ledger.verdicts import Verdict
from pytest_haico.runner.walltime import JobEndTime, WalltimeAdmission
from pytest_haico.slurm.client import Answer, NoAnswer, NotRun
from pytest_haico.slurm.records import parse_slurm_time

END = "2026-12-01T03:14:15"
END_S = datetime.fromisoformat(END).timestamp()
SQUEUE = ["squeue", "-h", "-j", "123", "-o", "%A %e"]
MARGIN_S = 125.0


class Clock:
    """An injected wall clock the test moves by hand."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


MISSING, TIMEOUT = "not on PATH", "no answer"
# What a command does: print this (status 0), exit non-zero (an `Answer`), or MISSING or
# TIMEOUT, which raise what `slurm.client.run` raises then.
Does = str | Answer


def failing(command: str, stderr: str) -> Answer:
    return Answer((command,), 1, "", stderr)


class FakeSlurm:
    """A `slurm.client.Run` answering each command from a table; it records every call."""

    def __init__(self, squeue: Does = f"123 {END}\n", scontrol: Does = "") -> None:
        self.answers: dict[str, Does] = {"squeue": squeue, "scontrol": scontrol}
        self.calls: list[tuple[list[str], float, Mapping[str, str] | None]] = []

    def __call__(
        self, argv: Sequence[str], *, environ: Mapping[str, str] | None, timeout_s: float
    ) -> Answer:
        self.calls.append((list(argv), timeout_s, environ))
        answer = self.answers[argv[0]]
        if answer == MISSING:
            raise NotRun.missing(argv[0])
        if answer == TIMEOUT:
            raise NoAnswer(argv[0], timeout_s)
        return answer if isinstance(answer, Answer) else Answer(tuple(argv), 0, answer)

    @property
    def commands(self) -> list[str]:
        return [argv[0] for argv, _, _ in self.calls]


def now_inline(refresh: Callable[[], None]) -> None:
    """A `spawn` that runs the refresh at once, on the calling thread."""
    refresh()


def end_time(
    slurm: FakeSlurm,
    clock: Clock,
    *,
    refresh_s: float = 300.0,
    env: Mapping[str, str] | None = None,
) -> JobEndTime:
    return JobEndTime("123", run=slurm, clock=clock, spawn=now_inline, refresh_s=refresh_s, env=env)


def admission(
    slurm: FakeSlurm,
    clock: Clock,
    ledger_dir: Path | None = None,
    *,
    job_id: str | None = "123",
) -> WalltimeAdmission:
    return WalltimeAdmission(
        job_id,
        ledger_dir,
        drain_margin_s=MARGIN_S,
        run=slurm,
        clock=clock,
        spawn=now_inline,
    )


def measured(admit: WalltimeAdmission, stratum: str, *durations: float) -> None:
    for duration in durations:
        admit.observe(stratum, Verdict.COMPLETED, duration)


def make_record(stratum: str, verdict: Verdict, duration_s: float, item: int) -> LedgerRecord:
    return LedgerRecord(
        run_id="7.1",
        campaign="default",
        arm="demo",
        stratum=stratum,
        item_id=f"{item:064x}",
        nodeid=f"t::x[{item}]",
        script="s",
        script_sha256="0" * 64,
        repeat=0,
        attempt=1,
        outcome=verdict.outcome,
        verdict=verdict,
        started_at="2026-01-01T00:00:00+00:00",
        finished_at="2026-01-01T00:00:01+00:00",
        duration_s=duration_s,
        model_identity={"kind": "unknown", "text": "m"},
        backend_identity={"kind": "unknown", "text": "b"},
        harness_version="0",
    )


# -- durations ----------------------------------------------------------------------------


# -- the job's end time ------------------------------------------------------------------


def test_the_end_time_comes_from_squeue_with_the_timeout_of_a_query_in_a_run() -> None:
    # The environment goes to Slurm's client as given: it keeps only the allow-listed part.
    slurm, clock, env = FakeSlurm(), Clock(END_S - 3600), {"PATH": "/x"}
    job = end_time(slurm, clock, env=env)
    assert job.refresh() == END_S
    assert job.end == END_S
    assert slurm.calls == [(SQUEUE, 10.0, env)]


@pytest.mark.parametrize(
    "failure",
    [
        MISSING,
        failing("squeue", "slurm_load_jobs error: Invalid job id"),
        TIMEOUT,
        "garbage\n",
        "123 Tomorr 03:14\n",
    ],
    ids=["missing-command", "non-zero-exit", "timeout", "no-line-of-the-job", "unparsable"],
)
def test_scontrol_answers_when_squeue_cannot(failure: Does) -> None:
    slurm = FakeSlurm(squeue=failure, scontrol=f"JobId=123 JobState=RUNNING EndTime={END}\n")
    job = end_time(slurm, Clock(END_S - 3600))
    assert job.refresh() == END_S
    assert slurm.commands == ["squeue", "scontrol"]


def test_an_unreadable_end_time_admits_and_is_reported_once() -> None:
    slurm = FakeSlurm(squeue=MISSING, scontrol=TIMEOUT)
    clock = Clock(END_S - 60)
    admit = admission(slurm, clock)
    measured(admit, "long", 3600)
    assert admit.refusal("long") is None
    assert admit.warnings == (
        "cannot read the end time of Slurm job 123 (squeue -h -j 123 -o '%A %e': squeue not "
        "found; scontrol -o show job 123: no answer within 10 s); walltime admission keeps "
        "the last end time it read, and admits without a walltime limit until it has one. "
        "Check that squeue and scontrol work on this node (squeue -j 123)",
    )
    slurm.answers["scontrol"] = failing("scontrol", "down\n")
    clock.now += 300
    assert admit.refusal("long") is None
    assert slurm.commands == ["squeue", "scontrol"] * 2
    assert len(admit.warnings) == 1


def test_a_failed_refresh_keeps_the_last_known_end_time() -> None:
    slurm, clock = FakeSlurm(), Clock(END_S - 3600)
    job = end_time(slurm, clock)
    job.refresh()
    slurm.answers["squeue"] = TIMEOUT
    slurm.answers["scontrol"] = "slurm_load_jobs error\n"
    assert job.refresh() == END_S


def test_a_job_made_unlimited_has_no_end_time_any_more() -> None:
    slurm, clock = FakeSlurm(), Clock(END_S - 60)
    admit = admission(slurm, clock)
    measured(admit, "long", 600)
    assert admit.refusal("long") is not None
    slurm.answers["squeue"] = "123 NONE\n"  # scontrol update JobId=123 TimeLimit=UNLIMITED
    clock.now += 300
    assert admit.refusal("long") is None
    assert admit.remaining_s() is None
    assert admit.warnings == ()


def test_the_end_time_is_read_again_only_every_refresh_interval() -> None:
    slurm, clock = FakeSlurm(), Clock(END_S - 3600)
    job = end_time(slurm, clock, refresh_s=300)
    job.refresh()
    later = "2026-12-01T04:14:15"  # scontrol update JobId=123 TimeLimit=...
    slurm.answers["squeue"] = f"123 {later}\n"
    clock.now += 299
    assert job.get() == END_S
    assert len(slurm.calls) == 1
    clock.now += 1
    assert job.get() == parse_slurm_time(later)
    assert len(slurm.calls) == 2
    clock.now += 299
    job.get()
    assert len(slurm.calls) == 2


def test_a_clock_that_went_back_reads_the_end_time_again() -> None:
    slurm, clock = FakeSlurm(), Clock(END_S - 3600)
    job = end_time(slurm, clock)
    job.refresh()
    clock.now -= 30
    job.get()
    assert len(slurm.calls) == 2


class SlowSlurm(FakeSlurm):
    """Answers the first read at once and holds every later one until released."""

    def __init__(self) -> None:
        super().__init__()
        self.entered, self.release = threading.Event(), threading.Event()

    def __call__(
        self, argv: Sequence[str], *, environ: Mapping[str, str] | None, timeout_s: float
    ) -> Answer:
        if self.calls:
            self.entered.set()
            assert self.release.wait(5)
        return super().__call__(argv, environ=environ, timeout_s=timeout_s)


def test_a_refresh_runs_in_the_background_and_one_at_a_time() -> None:
    later = "2026-12-01T04:14:15"
    slurm, clock = SlowSlurm(), Clock(END_S - 3600)
    job = JobEndTime("123", run=slurm, clock=clock)
    job.refresh()
    slurm.answers["squeue"] = f"123 {later}\n"
    clock.now += 300
    assert job.get() == END_S  # returns at once with the cached value
    assert slurm.entered.wait(5)
    clock.now += 300
    assert job.get() == END_S  # no second read while one is under way
    slurm.release.set()
    for _ in range(500):
        if job.end != END_S:
            break
        threading.Event().wait(0.01)
    assert job.end == parse_slurm_time(later)


# -- item times ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("durations", "p95"),
    [([7.0], 7.0), (list(range(1, 21)), 19), (list(range(1, 22)), 20), (list(range(14)), 13)],
    ids=["one-sample", "20-samples", "21-samples", "14-samples"],
)
def test_p95_is_the_nearest_rank(durations: list[float], p95: float) -> None:
    times = ItemTimes()
    for duration in reversed(durations):
        times.observe("s", Verdict.COMPLETED, duration)
    assert times.get("s") == ItemTime(p95_s=p95, longest_s=max(durations), samples=len(durations))


def test_only_attempts_that_ran_to_their_end_measure_an_item_time() -> None:
    times = ItemTimes()
    counted = {verdict: times.observe("s", verdict, 100.0) for verdict in Verdict}
    assert {verdict.value for verdict, yes in counted.items() if yes} == {
        "completed",
        "expectation_failed",
        "recursion_limit",
        "blank_turn",
    }
    assert times.get("s") == ItemTime(p95_s=100.0, longest_s=100.0, samples=4)
    # Cut by a drain or a kill, by a failure, or run on another model: not an item time.
    for verdict in ("interrupted", "infra_error", "rate_limited", "gave_up", "substituted"):
        assert not times.observe("t", verdict, 9000.0)
    assert times.get("t") is None


@pytest.mark.parametrize(
    ("stratum", "verdict", "duration"),
    [
        (None, "completed", 1.0),
        ("s", None, 1.0),
        ("s", ["completed"], 1.0),
        ("s", "completed", "1.0"),
        ("s", "completed", True),
        ("s", "completed", float("nan")),
        ("s", "completed", -1.0),
        ("s", "completed", None),
    ],
)
def test_a_record_without_a_usable_stratum_verdict_or_duration_is_passed_over(
    stratum: object, verdict: object, duration: object
) -> None:
    times = ItemTimes()
    assert not times.observe(stratum, verdict, duration)
    assert times.get("s") is None


def test_item_times_come_from_every_ledger_of_the_arm(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    ledger.mkdir()
    first = [
        make_record("long", Verdict.COMPLETED, 500.0, 1),
        make_record("long", Verdict.INTERRUPTED, 7000.0, 2),  # cut by a drain
        make_record("short", Verdict.EXPECTATION_FAILED, 20.0, 3),
    ]
    (ledger / "7.1.jsonl").write_bytes(b"".join(record_line(r) for r in first) + b"not json\n")
    second = record_line(make_record("long", Verdict.RECURSION_LIMIT, 542.0, 2))
    (ledger / "8.1.jsonl").write_bytes(second + second[:40])  # a torn last line
    warnings: list[str] = []
    times = ItemTimes.from_ledger_dir(ledger, warn=warnings.append)
    assert times.get("long") == ItemTime(p95_s=542.0, longest_s=542.0, samples=2)
    assert times.get("short") == ItemTime(p95_s=20.0, longest_s=20.0, samples=1)
    assert warnings == []  # broken lines are the resume index's to report


def test_an_unreadable_ledger_directory_is_reported_and_admits(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    ledger.write_text("a file where the directory should be\n")
    admit = admission(FakeSlurm(), Clock(END_S - 60), ledger)
    assert admit.refusal("long") is None
    (warning,) = admit.warnings
    assert warning.startswith(
        f"walltime admission cannot use the item times of earlier runs: the ledger directory "
        f"{ledger} is not a directory;"
    )
    assert warning.endswith(
        "strata without a measured item time are admitted without a walltime check"
    )


# -- the refusal ----------------------------------------------------------------------------


def test_the_refusal_names_the_job_its_remaining_time_the_p95_and_the_margin() -> None:
    clock = Clock(END_S - 250)
    admit = admission(FakeSlurm(), clock)
    measured(admit, "long", *[60.0] * 13, 542.0)
    assert admit.refusal("long") == (
        "job 123 ends in 4 min 10 s; items of stratum long take 9 min 2 s (p95 of 14) + "
        "125 s drain margin: not admitting"
    )
    clock.now = END_S + 5
    assert admit.refusal("long") == (
        "job 123 is at its end time; items of stratum long take 9 min 2 s (p95 of 14) + "
        "125 s drain margin: not admitting"
    )


def test_a_stratum_is_admitted_while_the_remaining_time_covers_p95_and_margin() -> None:
    clock = Clock(END_S - (542.0 + MARGIN_S))
    admit = admission(FakeSlurm(), clock)
    measured(admit, "long", 542.0)
    measured(admit, "short", 20.0)
    assert admit.refusal("long") is None
    clock.now += 1
    assert admit.refusal("long") is not None
    assert admit.refusal("short") is None


def test_a_stratum_without_history_is_admitted(tmp_path: Path) -> None:
    admit = admission(FakeSlurm(), Clock(END_S - 1), tmp_path / "no-ledger-yet")
    measured(admit, "long", 542.0)
    assert admit.refusal("new") is None
    assert admit.refusal("long") is not None
    assert admit.warnings == ()


def test_this_runs_conversations_add_item_times() -> None:
    admit = admission(FakeSlurm(), Clock(END_S - 600))
    assert admit.refusal("long") is None
    admit.observe("long", Verdict.INTERRUPTED, 5000.0)
    assert admit.refusal("long") is None
    admit.observe("long", "completed", 500.0)
    assert admit.refusal("long") is not None


@pytest.mark.parametrize("job_id", [None, ""])
def test_without_a_job_nothing_is_run_and_everything_is_admitted(job_id: str | None) -> None:
    slurm = FakeSlurm()
    admit = admission(slurm, Clock(END_S), job_id=job_id)
    measured(admit, "long", 10_000.0)
    assert admit.refusal("long") is None
    assert admit.remaining_s() is None
    assert slurm.calls == []
    assert admit.warnings == ()


class BrokenClock(Clock):
    broken = False

    def __call__(self) -> float:
        if self.broken:
            raise RuntimeError("clock broke")
        return self.now


def test_the_refusal_admits_rather_than_raise(caplog: pytest.LogCaptureFixture) -> None:
    clock = BrokenClock(END_S - 60)
    admit = admission(FakeSlurm(), clock)
    measured(admit, "long", 600.0)
    assert admit.refusal("long") is not None
    clock.broken = True
    assert admit.refusal("long") is None
    assert "walltime admission failed for stratum 'long'; admitting" in caplog.text
