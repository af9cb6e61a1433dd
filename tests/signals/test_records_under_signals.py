"""Signals at any moment leave whole records, never two for one attempt; INT works even when
the process inherited it ignored, as a batch shell's background job does."""

from __future__ import annotations

import signal
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest

from pytest_haico.campaign.signals import SessionSignals, TerminatedError
from pytest_haico.config.settings import Settings
from pytest_haico.config.slurm import SlurmJob
from pytest_haico.ledger.recorder import Recorder
from pytest_haico.runner.arm_run import ArmRun
from pytest_haico.runner.arm_runs import ArmRuns
from pytest_haico.runner.stopping import StopKind
from tests.harness import CampaignProject


def _ignore_int() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def test_int_inherited_as_ignored_still_interrupts_the_run(campaign: CampaignProject) -> None:
    campaign.arm("a")
    campaign.simple_scripts(*(f"s{i:02d}" for i in range(20)))
    run = campaign.start(
        "--haico-exit", "campaign", env={"HAICO_TEST_ITEM_SECONDS": "0.5"}, preexec_fn=_ignore_int
    )
    run.wait_for(lambda: campaign.ledger_lines("a") != [], timeout=60, what="a record")
    run.send_signal(signal.SIGINT)
    assert run.wait(timeout=60) == 75, run.output()
    records = campaign.records("a")
    assert len(records) < 20  # it stopped early
    # The item running at the signal is recorded interrupted, unless the signal came while
    # its completed record was being written: then that record stands, whole.
    assert [r["verdict"] for r in records[:-1]] == ["completed"] * (len(records) - 1)
    assert records[-1]["verdict"] in ("completed", "interrupted")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGUSR1])
def test_a_signal_amid_record_writes_leaves_whole_lines_and_one_record_per_attempt(
    campaign: CampaignProject, signum: signal.Signals
) -> None:
    campaign.arm("a")
    campaign.simple_scripts(*(f"s{i:03d}" for i in range(300)))
    # Items that take no time: the main thread spends its time writing records.
    for round_ in range(3):
        run = campaign.start("--haico-exit", "campaign")
        written = 20 * (round_ + 1)
        run.wait_for(
            lambda: len(campaign.ledger_lines("a")) > written,  # noqa: B023 (used at once)
            timeout=60,
            what="records being written",
        )
        run.send_signal(signum)
        # 0: every item was done before the signal came; -signum: it came after the
        # handlers were restored at unconfigure, as the process was exiting.
        assert run.wait(timeout=60) in (0, 75, -signum), run.output()
    final = campaign.run_subprocess("--haico-exit", "campaign")
    assert final.ret == 0, final.stdout.str()
    records = campaign.records("a")  # every line parses
    # One run records an item once; an interrupted attempt is tried again with its number.
    per_run = Counter((r["run_id"], r["item_id"]) for r in records)
    assert max(per_run.values()) == 1
    terminal = Counter(r["item_id"] for r in records if r["verdict"] != "interrupted")
    assert len(terminal) == 300 and set(terminal.values()) == {1}


def _signals(tmp_path: Path, *, started: bool = True) -> SessionSignals:
    """The session's signal handlers; `started`: its collection has begun."""
    recorder = Recorder(
        campaign_dir=tmp_path / "default",
        campaign="default",
        job=SlurmJob.from_environ({}),
        max_attempts=3,
    )
    settings = cast(Settings, SimpleNamespace(concurrency=1, dump_interval=0.0, drain_timeout=1.0))
    signals = SessionSignals(ArmRuns(settings, {}, recorder), drain_timeout_s=1.0)
    if started:
        signals.pytest_collection()
    return signals


def test_before_the_session_starts_an_interrupt_is_held_until_collection(
    tmp_path: Path,
) -> None:
    signals = _signals(tmp_path, started=False)
    signals._term(signal.SIGTERM, None)  # at configure or session start: nothing raised
    assert signals.sessions.stops.get(StopKind.TERMINATED) is not None
    with pytest.raises(TerminatedError):
        signals.pytest_collection()


def test_an_interrupt_during_a_deferred_block_is_raised_after_it(tmp_path: Path) -> None:
    signals = _signals(tmp_path)
    ran_to_the_end = False
    with pytest.raises(TerminatedError), signals.deferred():
        signals._term(signal.SIGTERM, None)
        ran_to_the_end = True
    assert ran_to_the_end
    with pytest.raises(KeyboardInterrupt):
        signals._int(signal.SIGINT, None)


def test_during_teardown_int_and_term_cancel_but_never_raise(tmp_path: Path) -> None:
    signals = _signals(tmp_path)
    signals.sessions.tearing_down = True
    signals._int(signal.SIGINT, None)
    signals._term(signal.SIGTERM, None)
    assert signals.sessions.stops.get(StopKind.TERMINATED) is not None


class _StartingRun:
    """What a signal handler may touch of an arm run whose stack is starting."""

    def __init__(self) -> None:
        self.interrupted: list[str] = []

    def interrupt_start(self, reason: str) -> None:
        self.interrupted.append(reason)


@pytest.mark.parametrize("handler", ["_int", "_usr1", "_term"])
def test_while_a_stack_starts_no_handler_raises_the_start_ends_at_its_next_step(
    tmp_path: Path, handler: str
) -> None:
    signals = _signals(tmp_path)
    starting = _StartingRun()
    signals.sessions._launching = True
    signals.sessions._starting = cast(ArmRun, starting)
    getattr(signals, handler)(signal.SIGTERM, None)  # raising here could orphan a Popen
    assert len(starting.interrupted) == 1
    interrupt = signals.sessions.start_interrupt
    assert isinstance(interrupt, KeyboardInterrupt)  # what the start raises when it ends
    if handler == "_term":
        assert isinstance(interrupt, TerminatedError)
