"""A ledger that cannot be read is a usage error before anything starts, naming the path:
skipping it would run finished items again, and a FIFO would block collection for ever."""

from __future__ import annotations

import errno
import os
import pwd
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_haico.errors import ResultsError
from pytest_haico.ledger import format as ledger_format
from pytest_haico.ledger.format import iter_ledger_dir
from tests.harness import CampaignProject

RESUME = "resume needs every ledger of the arm, or it would run finished items again"


def ledger_dir(campaign: CampaignProject) -> Path:
    return campaign.root / "results" / "default" / "demo" / "ledger"


def finished_campaign(campaign: CampaignProject) -> Path:
    campaign.arm("demo")
    campaign.simple_scripts("a", "b")
    assert campaign.run().ret == 0
    return ledger_dir(campaign)


def assert_refused_before_anything_ran(
    result: pytest.RunResult, campaign: CampaignProject, stray: Path
) -> None:
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.assert_outcomes()
    # Out of the way first: reading a FIFO blocks.
    stray.rmdir() if stray.is_dir() else stray.unlink()
    assert len(campaign.records("demo")) == 2, "an item ran again"
    assert list((stray.parent.parent / "claims").iterdir()) == [], "a claim outlived the run"


def test_a_directory_named_like_a_ledger_is_refused(campaign: CampaignProject) -> None:
    ledgers = finished_campaign(campaign)
    (ledgers / "stray.jsonl").mkdir()
    result = campaign.run()
    result.stderr.fnmatch_lines(
        [
            f"ERROR: haico: cannot read the ledger {ledgers}/stray.jsonl: it is a directory, not "
            f"a regular file; {RESUME}: move it out of {ledgers}"
        ]
    )
    assert_refused_before_anything_ran(result, campaign, ledgers / "stray.jsonl")


@pytest.mark.subprocess
def test_a_fifo_named_like_a_ledger_is_refused_instead_of_blocking(
    campaign: CampaignProject,
) -> None:
    ledgers = finished_campaign(campaign)
    os.mkfifo(ledgers / "pipe.jsonl")
    # A subprocess with a timeout: reading the FIFO used to block for ever.
    result = campaign.run_subprocess(timeout=60)
    result.stderr.fnmatch_lines(
        [
            f"ERROR: haico: cannot read the ledger {ledgers}/pipe.jsonl: it is a FIFO, not a "
            f"regular file; {RESUME}: move it out of {ledgers}"
        ]
    )
    assert_refused_before_anything_ran(result, campaign, ledgers / "pipe.jsonl")


@pytest.mark.parametrize("resume", [True, False], ids=["resume", "no-resume"])
def test_a_ledger_directory_replaced_by_a_file_is_refused(
    campaign: CampaignProject, resume: bool
) -> None:
    campaign.arm("demo")
    campaign.simple_scripts(*(f"s{i}" for i in range(11)))
    ledgers = ledger_dir(campaign)
    ledgers.parent.mkdir(parents=True)
    ledgers.write_text("not a directory\n")
    result = campaign.run(*([] if resume else ["--haico-no-resume"]))
    result.stderr.fnmatch_lines(
        [
            f"ERROR: haico: cannot write to the results directory {campaign.root}/results: "
            f"{ledgers}: [[]Errno 20[]] exists and is not a directory; the results need a "
            "directory there: move it aside, then rerun"
        ]
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.assert_outcomes()


def test_the_reader_refuses_a_ledger_directory_that_is_a_file(tmp_path: Path) -> None:
    ledgers = tmp_path / "ledger"
    ledgers.write_text("")
    with pytest.raises(ResultsError) as refused:
        list(iter_ledger_dir(ledgers, warn=pytest.fail))
    assert str(refused.value) == (
        f"the ledger directory {ledgers} is not a directory; {RESUME}: move it aside (the "
        "ledger directory holds one <run_id>.jsonl per run), then rerun"
    )


def test_the_reader_refuses_a_dangling_link_named_like_a_ledger(tmp_path: Path) -> None:
    (tmp_path / "gone.jsonl").symlink_to(tmp_path / "elsewhere" / "gone.jsonl")
    with pytest.raises(ResultsError) as refused:
        list(iter_ledger_dir(tmp_path, warn=pytest.fail))
    assert str(refused.value) == (
        f"cannot read the ledger {tmp_path}/gone.jsonl: it is a symbolic link to a missing "
        f"file; {RESUME}: restore its target, or remove the link"
    )


def test_an_io_error_while_reading_a_ledger_names_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "a.jsonl").write_text("{}\n")

    def failing_disk(*args: object, **kwargs: object) -> Iterator[object]:
        raise OSError(errno.EIO, os.strerror(errno.EIO))
        yield

    monkeypatch.setattr(ledger_format, "_iter_records", failing_disk)
    with pytest.raises(ResultsError) as refused:
        list(iter_ledger_dir(tmp_path, warn=pytest.fail))
    assert str(refused.value) == (
        f"cannot read the ledger {tmp_path}/a.jsonl: [Errno 5] Input/output error; {RESUME}: "
        "repair its file system"
    )


# -- a ledger this user may not read -------------------------------------------------------

READ_AS_NOBODY = """
import os, sys
from pathlib import Path
from pytest_haico.errors import ResultsError
from pytest_haico.ledger import format as ledger_format
from pytest_haico.ledger.format import iter_ledger_dir

os.setgid({gid})
os.setuid({uid})
try:
    records = list(iter_ledger_dir(Path(sys.argv[1]), warn=print))
except ResultsError as exc:
    print(f"ResultsError: {{exc}}")
else:
    print(f"read {{len(records)}} records")
"""


@pytest.fixture
def shared_tmp() -> Iterator[Path]:
    """A directory another user can reach (pytest's own tmp root is 0700)."""
    if os.geteuid() != 0:
        pytest.skip("reading as another user needs root")
    with tempfile.TemporaryDirectory() as name:
        os.chmod(name, 0o755)
        yield Path(name)


def read_as_nobody(directory: Path) -> str:
    nobody = pwd.getpwnam("nobody")
    script = READ_AS_NOBODY.format(uid=nobody.pw_uid, gid=nobody.pw_gid)
    done = subprocess.run(
        [sys.executable, "-c", script, str(directory)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd="/",
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.mark.subprocess
def test_a_ledger_this_user_may_not_read_is_an_error_naming_it(shared_tmp: Path) -> None:
    ledgers = shared_tmp / "ledger"
    ledgers.mkdir(mode=0o755)
    (ledgers / "a.jsonl").write_text("")
    (ledgers / "b.jsonl").write_text("")
    os.chmod(ledgers / "b.jsonl", 0o600)  # root's alone
    assert read_as_nobody(ledgers) == (
        f"ResultsError: cannot read the ledger {ledgers}/b.jsonl: [Errno 13] Permission "
        f"denied; {RESUME}: make it readable for this user"
    )


@pytest.mark.subprocess
def test_a_ledger_directory_this_user_may_not_list_is_an_error_naming_it(
    shared_tmp: Path,
) -> None:
    ledgers = shared_tmp / "ledger"
    ledgers.mkdir(mode=0o711)
    assert read_as_nobody(ledgers) == (
        f"ResultsError: cannot list the ledger directory {ledgers}: [Errno 13] Permission "
        f"denied; {RESUME}: make it readable for this user"
    )
