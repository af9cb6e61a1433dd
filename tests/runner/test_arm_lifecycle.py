"""An arm's run over fakes (no service, no process): its stack starts once and stops exactly
once whatever fails, an interrupted start stops what started, gates-only stops short, a dead
service ends what is in flight as infra_error, and the final dump runs only on a normal stop.
The fast loop for `runner/arm_run.py` and its collaborators."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pytest_haico.errors import DumpError, NotAdmittedError, StackError
from pytest_haico.gates.result import GateFailedError, failed
from pytest_haico.ledger.records import ErrorInfo
from pytest_haico.ledger.verdicts import Verdict
from tests.polling import wait_for
from tests.runner.arm_fakes import TIMEOUT_S, ArmHarness, attempt, wait_for_conversation


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[ArmHarness]:
    """An arm run over fakes, stopped at the end as the session stops every arm."""
    harness = ArmHarness(tmp_path)
    yield harness
    harness.run.stop()


def test_a_run_starts_its_stack_once_and_stops_it_exactly_once(harness: ArmHarness) -> None:
    view = harness.run.start()
    assert (view.arm, view.backend_url) == ("demo", harness.stack.backend_url)
    assert "fake-admin-token" not in repr(view)
    assert harness.opened == ["stack", "channel", "dumps"]
    # The arm's records are filtered through a redactor that knows the stack's secrets.
    assert harness.recorder.redactors["demo"] is harness.run.redactor
    assert "fake-api-key" not in harness.run.redactor.redact("key fake-api-key")
    harness.run.stop()
    harness.run.stop()
    assert (harness.stack.started, harness.stack.stopped) == (1, 1)
    assert harness.run.stopped
    assert harness.channel.closed


def _fail_open(harness: ArmHarness) -> None:
    harness.channel.open_error = StackError("the snapshot connection to postgres failed: no")


def _fail_a_gate(harness: ArmHarness) -> None:
    harness.channel.gates = (failed("served_model", "it serves 'other'", "fix the arm"),)


def _fail_run_config(harness: ArmHarness) -> None:
    harness.server_error = RuntimeError("the model server's account broke")


def _fail_the_stack(harness: ArmHarness) -> None:
    harness.stack.start_error = StackError("postgres exited with status 1 before it was healthy")


@pytest.mark.parametrize(
    ("fail", "error", "message"),
    [
        (_fail_the_stack, StackError, "postgres exited with status 1 before it was healthy"),
        (_fail_open, StackError, "the snapshot connection to postgres failed: no"),
        (_fail_a_gate, GateFailedError, "gate served_model failed: it serves 'other'; fix the arm"),
        (_fail_run_config, StackError, "RuntimeError: the model server's account broke"),
    ],
    ids=["stack", "channel", "gate", "run-config"],
)
def test_a_failed_start_raises_a_stack_error_and_the_stack_stops_exactly_once(
    harness: ArmHarness, fail: Callable[[ArmHarness], None], error: type[StackError], message: str
) -> None:
    fail(harness)
    with pytest.raises(error) as raised:
        harness.run.start()
    assert str(raised.value) == message
    harness.run.stop()  # what the session's end does for every arm it started
    assert (harness.stack.started, harness.stack.stopped) == (1, 1)
    assert harness.channel.conversing == 0


@pytest.mark.parametrize(
    ("target", "what", "started"),
    [
        ("results/demo/runs/local-test.0/timeline.json", "the run's timeline", 0),
        ("gates.json", "the gates' results", 0),
        ("results/demo/runs/local-test.0/run-config.env", "run-config.env/.json in", 1),
    ],
    ids=["timeline", "gates", "run-config"],
)
def test_a_start_up_write_that_fails_ends_the_start_with_one_line_naming_file_and_fix(
    tmp_path: Path, target: str, what: str, started: int
) -> None:
    (tmp_path / target).mkdir(parents=True)  # a write there fails as on a full disk
    harness = ArmHarness(tmp_path)
    harness.run.request.gate_log.check((), redactor=harness.run.redactor)  # the preflight's
    with pytest.raises(StackError) as raised:
        harness.run.start()
    harness.run.stop()
    message = str(raised.value)
    assert message.startswith(f"cannot write {what} {tmp_path}/"), message
    assert "[Errno 21] Is a directory on the file system " in message
    assert message.endswith("then rerun the same command: the items not done run again")
    assert raised.value.brief == f"cannot write {what}: Is a directory (where and the fix: " + (
        "the haico summary)"
    )
    # Nothing started before the run's first files; a stack that started is stopped.
    assert (harness.stack.started, harness.stack.stopped) == (started, started)


def test_a_failing_stop_step_still_stops_the_stack_exactly_once(harness: ArmHarness) -> None:
    harness.run.start()
    harness.channel.close_error = RuntimeError("the client would not close")  # logged
    harness.dumps.dump_error = DumpError("pg_dump (final) exited 1: no space left")
    harness.run.stop()
    assert harness.stack.stopped == 1
    assert harness.run.dump_failure == (
        "the final dump failed: pg_dump (final) exited 1: no space left"
    )


def test_a_stop_that_raises_has_still_stopped_the_stack(harness: ArmHarness) -> None:
    harness.run.start()

    def broken() -> None:
        raise RuntimeError("the periodic dumps would not stop")

    harness.dumps.stop_periodic = broken  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="the periodic dumps would not stop"):
        harness.run.stop()
    harness.run.stop()
    assert harness.stack.stopped == 1


def test_a_start_interrupted_mid_way_stops_what_started_and_raises_a_stack_error(
    harness: ArmHarness,
) -> None:
    harness.channel.block_open = True

    def interrupt() -> None:  # as a signal handler does, while the start waits on the loop
        harness.channel.opening.wait(TIMEOUT_S)
        # The call under way is known to the runner just after its coroutine began: an
        # interrupt in between reaches it only at the start's next step, so send it again.
        deadline = time.monotonic() + TIMEOUT_S
        while not harness.channel.open_cancelled and time.monotonic() < deadline:
            harness.run.interrupt_start("SIGINT")
            time.sleep(0.05)

    interrupter = threading.Thread(target=interrupt)
    interrupter.start()
    with pytest.raises(StackError):
        harness.run.start()
    interrupter.join(TIMEOUT_S)
    assert harness.channel.open_cancelled
    assert set(harness.stack.interrupted) == {"SIGINT"}
    assert (harness.stack.started, harness.stack.stopped) == (1, 1)
    assert harness.opened == ["stack", "channel"]  # no dumps, no run-config
    assert not (harness.run_dir / "run-config.env").exists()


def test_a_start_interrupted_before_the_stack_started_never_starts_it(
    harness: ArmHarness,
) -> None:
    harness.run.interrupt_start("USR1")
    with pytest.raises(StackError, match=r"^USR1: the start was interrupted$"):
        harness.run.start()
    assert harness.opened == []
    harness.run.stop()
    assert harness.stack.started == 0


def test_an_interrupt_while_the_stack_is_built_reaches_the_stack_before_it_starts(
    harness: ArmHarness,
) -> None:
    harness.while_building = lambda: harness.run.interrupt_start("SIGTERM")
    with pytest.raises(StackError, match="SIGTERM: the stack was stopped while starting"):
        harness.run.start()
    assert harness.stack.interrupted == ["SIGTERM"]
    harness.run.stop()
    assert harness.stack.stopped == 1


def test_gates_only_stops_short_after_the_dynamic_gates(tmp_path: Path) -> None:
    harness = ArmHarness(tmp_path, gates_only=True)
    view = harness.run.start()
    assert view.arm == "demo"
    assert json.loads((tmp_path / "gates.json").read_text())["gates"][0]["name"] == "canary_turn"
    harness.run.stop(final_dump=False)  # what --haico-gates-only does next
    assert harness.opened == ["stack", "channel"]  # no dumps, no watch
    assert not (harness.run_dir / "run-config.env").exists()
    assert harness.run.dumps is None
    assert (harness.channel.conversations, harness.stack.stopped) == (0, 1)


def test_conversations_are_recorded_as_they_end(harness: ArmHarness) -> None:
    harness.run.start()
    states = [attempt(n) for n in range(3)]
    for state in states:
        harness.run.conversations.submit(state)
    done = [wait_for_conversation(harness.run, state) for state in states]
    assert [c.verdict for c in done] == [Verdict.COMPLETED] * 3
    assert {r.state for r in harness.recorder.records} == set(states)
    assert done[0].transcript == harness.recorder.paths("demo").transcript(
        states[0].spec.item_id, "local-test.0", 1
    )


@pytest.mark.parametrize("service", ["backend", "llm"])
def test_a_service_death_ends_what_is_in_flight_as_infra_error_naming_it(
    harness: ArmHarness, service: str
) -> None:
    harness.channel.hold = True
    harness.run.start()
    states = [attempt(0), attempt(1)]
    for state in states:
        harness.run.conversations.submit(state)
    wait_for(lambda: harness.channel.conversing == 2, timeout=TIMEOUT_S, what="2 in flight")
    harness.stack.processes[service].status = 1
    done = [wait_for_conversation(harness.run, state) for state in states]
    pid = harness.stack.processes[service].pid
    named = f"{service} (pid {pid}) exited with status 1 while conversations were in flight"
    for conversation in done:
        assert conversation.verdict is Verdict.INFRA_ERROR
        assert conversation.result.error is not None
        assert conversation.result.error.kind == "service_died"
        assert conversation.result.error.message.startswith(named)
    assert [r.verdict for r in harness.recorder.records] == [Verdict.INFRA_ERROR] * 2
    # The watch tells the session after it cancelled what was in flight: their records can
    # come first.
    wait_for(lambda: bool(harness.stops), timeout=TIMEOUT_S, what="the stop")
    assert len(harness.stops) == 1 and harness.stops[0].startswith(named)
    with pytest.raises(NotAdmittedError):  # nothing more is admitted
        harness.run.conversations.wait(attempt(2))


def test_a_tripped_breaker_records_what_is_in_flight_at_once(tmp_path: Path) -> None:
    """The stack is bad: a conversation in flight at the trip is cancelled (recorded
    interrupted) rather than waited for, so the session can report every item that started
    (`ends_at_once`) and stop before the first that did not."""
    harness = ArmHarness(tmp_path, concurrency=2)
    harness.channel.hold = True
    harness.run.start()
    try:
        held = attempt(0)
        harness.run.conversations.submit(held)
        wait_for(lambda: harness.channel.conversing == 1, timeout=TIMEOUT_S, what="1 held")
        harness.channel.hold = False
        harness.channel.verdict = Verdict.INFRA_ERROR
        harness.channel.error = ErrorInfo(kind="backend", message="502 from the backend")
        states = [attempt(n) for n in range(1, 8)]
        for state in states:
            harness.run.conversations.submit(state)
        for state in states[:5]:  # the breaker trips at 5 of the last 8
            assert wait_for_conversation(harness.run, state).verdict is Verdict.INFRA_ERROR
        assert wait_for_conversation(harness.run, held).verdict is Verdict.INTERRUPTED
        assert harness.run.conversations.ends_at_once(
            held
        ) and harness.run.conversations.ends_at_once(states[0])
        for state in states[5:]:
            assert not harness.run.conversations.ends_at_once(state)
            with pytest.raises(NotAdmittedError, match="circuit breaker"):
                harness.run.conversations.wait(state)
    finally:
        harness.run.stop()


def test_a_dead_postgres_leaves_no_final_dump_and_says_so(harness: ArmHarness) -> None:
    harness.channel.hold = True
    harness.run.start()
    state = attempt(0)
    harness.run.conversations.submit(state)
    wait_for(lambda: harness.channel.conversing == 1, timeout=TIMEOUT_S, what="1 in flight")
    harness.stack.processes["postgres"].status = -9
    assert wait_for_conversation(harness.run, state).verdict is Verdict.INFRA_ERROR
    harness.run.stop()
    assert harness.dumps.calls == ["start_periodic", "stop_periodic"]
    assert harness.run.dump_failure == "no final dump: postgres had died"


@pytest.mark.parametrize(
    ("final_dump", "calls"),
    [
        (True, ["start_periodic", "stop_periodic", "dump final"]),
        (False, ["start_periodic", "abort"]),  # SIGTERM: the newest periodic dump survives
    ],
    ids=["normal stop", "TERM"],
)
def test_the_final_dump_runs_on_a_normal_stop_and_is_skipped_on_term(
    harness: ArmHarness, final_dump: bool, calls: list[str]
) -> None:
    harness.run.start()
    harness.run.stop(final_dump=final_dump)
    assert harness.dumps.calls == calls
    config = json.loads((harness.run_dir / "run-config.json").read_text())
    assert config["values"]["VLLM_VERSION"] == "0.0-fake"
    assert "metrics_start" in config
    assert ("metrics_end" in config) is final_dump
    assert harness.stack.stopped == 1


def test_a_tripped_breaker_stops_admitting_and_quotes_the_failing_services_log(
    tmp_path: Path,
) -> None:
    harness = ArmHarness(tmp_path, concurrency=1)
    harness.channel.verdict = Verdict.INFRA_ERROR
    harness.channel.error = ErrorInfo(kind="backend_model", message="502 from the model")
    harness.run.start()
    try:
        states = [attempt(n) for n in range(8)]
        for state in states:
            harness.run.conversations.submit(state)
        for state in states[:5]:  # the breaker trips at 5 of the last 8
            assert wait_for_conversation(harness.run, state).verdict is Verdict.INFRA_ERROR
        for state in states[5:]:
            with pytest.raises(NotAdmittedError, match="circuit breaker"):
                harness.run.conversations.wait(state)
        (reason,) = harness.stops
        assert reason.startswith("circuit breaker: ")
        assert reason.endswith("; the tail of the llm log:\n    llm started\n    llm said goodbye")
    finally:
        harness.run.stop()
