"""The file `haico report --html FILE` writes: the results' mode whatever the umask (the
page holds transcripts), written whole and renamed over a regular file; a symlink or a FIFO
that another user left at FILE (a shared /tmp) is refused, never written through, replaced
or waited on."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_haico.cli.main import main
from tests.fifos import without_waiting
from tests.results.ledgers import record, write_ledger


@pytest.fixture
def campaign(tmp_path: Path) -> Path:
    campaign = tmp_path / "results" / "c"
    write_ledger(campaign / "demo", "local-1.1", [record("a0"), record("a1")])
    return campaign


@pytest.fixture
def open_umask() -> Iterator[None]:
    previous = os.umask(0)
    yield
    os.umask(previous)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_page_gets_the_results_mode_whatever_the_umask(
    campaign: Path, tmp_path: Path, open_umask: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    page = tmp_path / "report.html"
    assert main(["report", str(campaign), "--html", str(page)]) == 0
    assert _mode(page) == 0o640
    monkeypatch.setenv("PYTEST_HAICO_RESULTS_MODE", "0644")  # widened, as for the results
    assert main(["report", str(campaign), "--html", str(page)]) == 0
    assert _mode(page) == 0o644
    assert page.read_text().startswith("<!DOCTYPE html>")
    assert [p.name for p in tmp_path.iterdir() if p.name != "results"] == ["report.html"]


def test_a_symlink_at_the_path_is_refused_and_its_target_left_alone(
    campaign: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "someone-elses-file"
    target.write_text("theirs\n")
    page = tmp_path / "report.html"
    page.symlink_to(target)
    assert main(["report", str(campaign), "--html", str(page)]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"haico: cannot write the HTML report {page}: it is a symbolic link, not a regular "
        "file: choose another --html path"
    )
    assert page.is_symlink() and target.read_text() == "theirs\n"


def test_a_fifo_at_the_path_is_refused_without_waiting_for_a_reader(
    campaign: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    page = tmp_path / "report.html"
    os.mkfifo(page)
    argv = ["report", str(campaign), "--html", str(page)]
    assert without_waiting(lambda: main(argv), page) == 2
    assert "it is a FIFO, not a regular file" in capsys.readouterr().err
    assert stat.S_ISFIFO(page.lstat().st_mode)
