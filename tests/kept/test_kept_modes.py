"""The kept stack's directories and supervisor.log get the results mode, whatever the umask
(issue 24: they were 0755 and 0644)."""

from __future__ import annotations

import os
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pytest_haico.config.experiment import Arm
from pytest_haico.config.settings import Profile
from pytest_haico.kept import control


class _Stop(Exception):
    pass


@pytest.fixture
def wide_umask() -> Iterator[None]:
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


@pytest.mark.usefixtures("wide_umask")
@pytest.mark.parametrize("file_mode", [0o640, 0o600])
def test_kept_directories_and_the_supervisor_log_have_the_results_mode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, file_mode: int
) -> None:
    def no_supervisor(*args: Any, **kwargs: Any) -> None:
        raise _Stop

    monkeypatch.setattr(subprocess, "Popen", no_supervisor)
    campaign = tmp_path / "results" / "camp"
    with pytest.raises(_Stop):
        control._start_supervisor(
            Arm(name="demo"),
            tmp_path / "state" / "demo.json",
            Profile.LOCAL,
            campaign,
            lambda line: None,
            request={"file_mode": file_mode},
        )
    (run,) = (campaign / "demo" / "kept").iterdir()
    directory_mode = file_mode | ((file_mode & 0o444) >> 2)
    for directory in (tmp_path / "results", campaign, campaign / "demo", run.parent, run):
        assert stat.S_IMODE(directory.stat().st_mode) == directory_mode, directory
    assert stat.S_IMODE((run / "supervisor.log").stat().st_mode) == file_mode
