"""Results are created 0640 / 0750 whatever the umask (a research group may read them), and
`--haico-results-mode` widens or narrows that; a mode others could write is refused."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from pytest_haico.driver.transcripts import TranscriptWriter
from pytest_haico.files import dir_mode, make_dirs
from pytest_haico.redact import Redactor
from tests.harness import CampaignProject
from tests.stack.stack_helpers import give_to_nobody, needs_root


def modes(root: Path) -> dict[str, set[str]]:
    """The octal modes of every file and every directory under `root`, itself included."""
    found: dict[str, set[str]] = {"files": set(), "dirs": {oct(stat.S_IMODE(root.stat().st_mode))}}
    for path in root.rglob("*"):
        kind = "dirs" if path.is_dir() else "files"
        found[kind].add(oct(stat.S_IMODE(path.stat().st_mode)))
    return found


def run_campaign(campaign: CampaignProject, *args: str) -> Path:
    campaign.arm("demo")
    campaign.simple_scripts("a", "b")
    assert campaign.run(*args).ret == 0
    results = campaign.root / "results"
    assert len(list(results.rglob("*.jsonl"))) == 1
    assert len(list(results.rglob("claim.json"))) == 1
    return results


@pytest.mark.parametrize("mask", [0o022, 0o077, 0o000], ids=oct)
@pytest.mark.usefixtures("umask")
def test_results_are_0640_and_0750_whatever_the_umask(campaign: CampaignProject, mask: int) -> None:
    os.umask(mask)
    results = run_campaign(campaign)
    assert modes(results) == {"files": {"0o640"}, "dirs": {"0o750"}}


@pytest.mark.usefixtures("umask")
def test_results_mode_option_sets_files_and_directories(campaign: CampaignProject) -> None:
    os.umask(0o077)
    results = run_campaign(campaign, "--haico-results-mode", "0644")
    assert modes(results) == {"files": {"0o644"}, "dirs": {"0o755"}}


@pytest.mark.usefixtures("umask")
def test_results_mode_from_env_and_ini(
    campaign: CampaignProject, monkeypatch: pytest.MonkeyPatch
) -> None:
    os.umask(0o022)
    campaign.pytester.makepyprojecttoml(
        '[tool.pytest.ini_options]\nhaico_results_mode = "0644"\n'
        'asyncio_default_fixture_loop_scope = "function"\n'
    )
    monkeypatch.setenv("PYTEST_HAICO_RESULTS_MODE", "600")  # the environment beats the ini
    results = run_campaign(campaign)
    assert modes(results) == {"files": {"0o600"}, "dirs": {"0o700"}}


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("0660", "group or others could write, and so change the ledger"),
        ("0646", "group or others could write, and so change the ledger"),
        ("0440", "the owner must be able to read and write"),
        ("0240", "the owner must be able to read and write"),
        ("0750", "a file mode has r and w bits only (no x, setuid, setgid or sticky bit)"),
        ("04640", "a file mode has r and w bits only (no x, setuid, setgid or sticky bit)"),
        ("rw-r-----", "not an octal number"),
        ("0o689", "not an octal number"),
    ],
)
def test_a_results_mode_others_could_write_or_the_owner_cannot_use_is_refused(
    campaign: CampaignProject, value: str, problem: str
) -> None:
    campaign.arm("demo")
    campaign.simple_scripts("a")
    result = campaign.run("--haico-results-mode", value)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            f"ERROR: haico: --haico-results-mode: invalid results mode {value!r}: {problem}; "
            "give an octal file mode such as 0640 (the default: the group may read) or 0644 "
            "(everyone may read)"
        ]
    )
    assert not (campaign.root / "results").exists()


@pytest.mark.parametrize(
    ("file_mode", "directory"), [(0o640, 0o750), (0o644, 0o755), (0o600, 0o700), (0o604, 0o705)]
)
def test_directories_get_x_wherever_the_file_mode_has_r(file_mode: int, directory: int) -> None:
    assert dir_mode(file_mode) == directory


@pytest.mark.usefixtures("umask")
@pytest.mark.parametrize("file_mode", [0o640, 0o600, 0o644])
def test_a_transcript_takes_the_mode_of_its_directory(tmp_path: Path, file_mode: int) -> None:
    os.umask(0o022)
    directory = tmp_path / "transcripts"
    make_dirs(directory, file_mode)
    writer = TranscriptWriter(directory / "t.jsonl", redactor=Redactor())
    writer.append({"kind": "step"})
    writer.close()
    assert writer.error is None
    assert stat.S_IMODE((directory / "t.jsonl").stat().st_mode) == file_mode


# -- results directories another user could write -------------------------------------------


def _refusal(directory: Path, problem: str) -> str:
    return (
        f"ERROR: haico: the results directory {directory} {problem}: records that another "
        "user could put there would be taken as this campaign's. Make it yours and writable "
        "by you only (chmod go-w), or choose a results directory of your own "
        "(--haico-results, or $PYTEST_HAICO_RESULTS)"
    )


def _planted_done(campaign: CampaignProject, arm_dir: Path) -> None:
    """A ledger that says every item is done, as another user could write one."""
    (arm_dir / "ledger").mkdir(parents=True, exist_ok=True)
    done = [{**record, "run_id": "999.1"} for record in campaign.records("demo")]
    (arm_dir / "ledger" / "999.1.jsonl").write_text("".join(json.dumps(r) + "\n" for r in done))


@pytest.mark.parametrize("where", ["campaign", "arm", "ledger"])
def test_a_results_directory_others_can_write_is_refused_before_its_ledgers_are_read(
    campaign: CampaignProject, where: str
) -> None:
    campaign.arm("demo")
    campaign.simple_scripts("a", "b")
    assert campaign.run().ret == 0
    arm_dir = campaign.root / "results" / "default" / "demo"
    for ledger in (arm_dir / "ledger").iterdir():
        ledger.unlink()  # the items are owed again, unless a planted ledger says otherwise
    _planted_done(campaign, arm_dir)
    directory = {"campaign": arm_dir.parent, "arm": arm_dir, "ledger": arm_dir / "ledger"}[where]
    directory.chmod(0o777)
    runs = sorted((arm_dir / "runs").iterdir())
    result = campaign.run()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert _refusal(directory, "is writable by group and others (mode 0777)") in result.stderr.str()
    assert sorted((arm_dir / "runs").iterdir()) == runs  # no run directory claimed
    directory.chmod(0o750)
    (arm_dir / "ledger" / "999.1.jsonl").unlink()
    assert campaign.run().ret == 0
    assert len(campaign.records("demo")) == 2  # run again: nothing was taken as done


@needs_root
def test_a_results_directory_of_another_user_is_refused(campaign: CampaignProject) -> None:
    campaign.arm("demo")
    campaign.simple_scripts("a")
    campaign_dir = campaign.root / "results" / "default"
    campaign_dir.mkdir(parents=True)
    give_to_nobody(campaign_dir, mode=0o755)
    result = campaign.run()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    owner = "is owned by uid 65534 (nobody), not by uid 0 (root)"
    assert _refusal(campaign_dir, owner) in result.stderr.str()
    assert list(campaign_dir.iterdir()) == []


def test_a_campaign_directory_linked_to_ones_own_is_used(
    campaign: CampaignProject, tmp_path: Path
) -> None:
    campaign.arm("demo")
    campaign.simple_scripts("a")
    scratch = tmp_path / "scratch"
    scratch.mkdir(mode=0o750)
    (campaign.root / "results").mkdir()
    (campaign.root / "results" / "default").symlink_to(scratch)
    assert campaign.run().ret == 0
    assert len(list((scratch / "demo" / "ledger").iterdir())) == 1
