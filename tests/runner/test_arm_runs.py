"""An arm whose stack failed to start is not started again: its later items fail at once."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest

from pytest_haico.config.experiment import Arm
from pytest_haico.config.settings import Profile, Settings
from pytest_haico.config.slurm import SlurmJob
from pytest_haico.errors import StackError
from pytest_haico.ledger.recorder import Recorder
from pytest_haico.runner.arm_run import ArmRun
from pytest_haico.runner.arm_runs import ArmRuns
from pytest_haico.runner.stopping import StopKind


def test_a_failed_arm_fails_every_later_use_with_the_same_error_and_no_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    starts: list[str] = []

    def refuse(self: ArmRun) -> object:
        starts.append(self.arm.name)
        raise StackError("postgres exited with status 1 before it was healthy")

    monkeypatch.setattr(ArmRun, "start", refuse)
    recorder = Recorder(
        campaign_dir=tmp_path / "default",
        campaign="default",
        job=SlurmJob.from_environ({}),
        max_attempts=3,
    )
    runs = ArmRuns(
        cast(
            Settings,
            SimpleNamespace(
                profile=Profile.LOCAL,
                site=None,
                shard="0/1",
                attach=None,
                results_mode=0o640,
                concurrency=1,
                dump_interval=0.0,
                drain_timeout=120.0,
                backend_cmd=None,
                backend_image=None,
                model_endpoint=None,
                model=None,
            ),
        ),
        {"demo": Arm(name="demo"), "other": Arm(name="other")},
        recorder,
    )
    expected = (
        "the stack of arm demo did not start: postgres exited with status 1 before it was healthy"
    )
    for _ in range(3):
        with pytest.raises(StackError) as raised:
            runs.stack("demo")
        assert str(raised.value) == expected
    assert starts == ["demo"]
    assert runs.stops.reason(StopKind.STACK_FAILED) == expected
    # Another arm has its own stack: it is tried (and fails here for its own reason).
    with pytest.raises(StackError, match="the stack of arm other did not start"):
        runs.stack("other")
    assert starts == ["demo", "other"]
    assert runs.stops.reason(StopKind.STACK_FAILED) == expected
    recorder.close()
