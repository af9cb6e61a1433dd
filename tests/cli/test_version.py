"""`haico --version`: the installed distribution's version."""

from __future__ import annotations

from importlib import metadata

import pytest

from pytest_haico.cli.main import main


def test_haico_version_prints_the_installed_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out == f"haico (pytest-haico) {metadata.version('pytest-haico')}\n"
