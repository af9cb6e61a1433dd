"""The wait for a service that watches its log (vLLM's): no deadline while the log advances
and the process lives, a stall timeout once the log stops, a failure at once when it dies."""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

import pytest

from pytest_haico.errors import StackError
from pytest_haico.procfs import is_alive
from pytest_haico.stack import HttpService, Orchestrator

LOADING_SERVICE = Path(__file__).with_name("loading_service.py")
SETTING = "[vllm] start_stall_timeout_s of arms/demo.toml"


def loading(
    *,
    lines: int,
    every: float,
    then: str,
    stall: float,
    deadline: float | None = None,
    progress_every: float | None = None,
) -> HttpService:
    """A service named llm that writes `lines` log lines `every` seconds apart, then `then`s."""

    def argv(port: int) -> list[str]:
        options = ["--lines", str(lines), "--every", str(every), "--then", then]
        return [sys.executable, str(LOADING_SERVICE), "--port", str(port), *options]

    return HttpService(
        name="llm",
        argv=argv,
        start_timeout=deadline,
        stall_timeout_s=stall,
        stall_setting=SETTING,
        progress_every_s=progress_every,
    )


def _start(service: HttpService, tmp_path: Path) -> Orchestrator:
    return Orchestrator([service], tmp_path / "logs", state_dir=tmp_path / "state", reap=False)


def test_a_log_that_advances_is_waited_for_past_the_stall_timeout(tmp_path: Path) -> None:
    # Four seconds of loading, a line every 0.1 s: twice the stall timeout, and no deadline.
    service = loading(lines=40, every=0.1, then="listen", stall=2.0)
    with _start(service, tmp_path) as stack:
        assert stack.timings["llm"].healthy >= 4.0
        assert service.probe(stack.port("llm"))


def test_a_log_that_stops_ends_the_wait_after_the_stall_timeout_with_its_tail(
    tmp_path: Path,
) -> None:
    service = loading(lines=3, every=0.1, then="hang", stall=1.0)
    stack = _start(service, tmp_path)
    with pytest.raises(StackError) as raised:
        stack.start()
    process = stack.processes["llm"]
    log = tmp_path / "logs" / "llm.log"
    # The silence is measured from the last line the log got (0.2 s after the first: three
    # lines 0.1 s apart), not from the spawn.
    assert process.spawned_at is not None
    assert time.monotonic() - process.spawned_at >= 0.2 + 1.0
    pytest.LineMatcher(str(raised.value).splitlines()).fnmatch_lines(
        [
            f"llm wrote nothing to its log for 1 s ({SETTING}) before it was healthy (pid "
            f"{process.pid}, port {process.port}, attempt 1); last lines of {log}:",
            "    loading: step 1 of 3",
            "    loading: step 2 of 3",
            "    loading: step 3 of 3",
        ]
    )
    assert not is_alive(process.pid or 0)


def test_a_process_that_dies_while_loading_fails_the_wait_at_once_with_its_tail(
    tmp_path: Path,
) -> None:
    # A stall timeout of an hour: only the death can end this wait in time for the test.
    service = loading(lines=2, every=0.1, then="exit", stall=3600.0)
    stack = _start(service, tmp_path)
    with pytest.raises(StackError) as raised:
        stack.start()
    pytest.LineMatcher(str(raised.value).splitlines()).fnmatch_lines(
        [
            "llm exited with status 1 before it was healthy (pid *, port *, attempt 1); last "
            "lines of *llm.log:",
            "    loading: step 2 of 2",
            "    RuntimeError: out of memory while loading",
        ]
    )


def test_a_deadline_set_beside_the_stall_timeout_still_ends_a_wait_whose_log_advances(
    tmp_path: Path,
) -> None:
    service = loading(lines=600, every=0.1, then="listen", stall=30.0, deadline=1.0)
    with pytest.raises(StackError, match=r"^llm was not healthy within 1 s \(pid "):
        _start(service, tmp_path).start()


def test_the_wait_reports_how_long_the_log_was_silent_of_the_stall_timeout(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    service = loading(lines=2, every=0.1, then="hang", stall=2.0, progress_every=0.5)
    caplog.set_level(logging.INFO, logger="pytest_haico.stack.start_wait")
    with pytest.raises(StackError):
        _start(service, tmp_path).start()
    said = [r.getMessage() for r in caplog.records if "not healthy yet" in r.getMessage()]
    assert said, caplog.text
    pytest.LineMatcher(said).fnmatch_lines(
        [
            "llm: not healthy yet after * s (log silent * s of the stall timeout's 2 s); its log "
            "last said: loading: step 2 of 2"
        ]
    )
