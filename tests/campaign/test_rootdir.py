"""A haico option's path never moves pytest's rootdir or configuration file: pytest reads a
value given as the next word for a test path before plugins load, and looks for both from
there (`pytest --haico-attach /tmp/.../stacks/demo.json` once collected the frozen copies
under results/ with no configuration at all)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.harness import CampaignProject

PYPROJECT = """\
[tool.pytest.ini_options]
addopts = ["-p", "no:langsmith_plugin"]
testpaths = ["experiments"]
asyncio_default_fixture_loop_scope = "function"
"""


@pytest.fixture
def project(campaign: CampaignProject) -> CampaignProject:
    campaign.pytester.makepyprojecttoml(PYPROJECT)
    campaign.arm("demo")
    campaign.simple_scripts("s1", "s2")
    return campaign


@pytest.fixture
def elsewhere(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory outside the project, as a kept stack's state directory under $TMPDIR."""
    return tmp_path_factory.mktemp("elsewhere")


def test_an_attach_file_in_the_next_word_is_refused_naming_the_equals_form(
    project: CampaignProject, elsewhere: Path
) -> None:
    state = elsewhere / "demo.json"
    state.write_text("{}")
    # Without a configuration pytest-asyncio would warn that its loop scope is unset.
    result = project.pytester.runpytest("-p", "no:asyncio", "--haico-attach", str(state))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    # The fix leads the line.
    result.stderr.fnmatch_lines(
        [
            f"ERROR: haico: write --haico-attach={state} (with '='): pytest read the next word, "
            f"{state}, as a test path before haico's options were known, and took the rootdir "
            f"* instead of {project.root} and the configuration none instead of "
            f"{project.root / 'pyproject.toml'} from it"
        ]
    )
    assert not (project.root / "results").exists()


def test_a_results_dir_in_the_equals_form_keeps_the_projects_rootdir_and_testpaths(
    project: CampaignProject, elsewhere: Path
) -> None:
    result = project.pytester.runpytest(f"--haico-results={elsewhere}")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    result.stdout.fnmatch_lines(
        [f"rootdir: {project.root}", "configfile: pyproject.toml", "testpaths: experiments"]
    )
    result.assert_outcomes(passed=2)
    assert list((elsewhere / "default" / "demo" / "ledger").glob("*.jsonl"))


def test_a_path_in_the_next_word_that_moves_nothing_is_accepted(
    project: CampaignProject,
) -> None:
    results = project.root / "results"
    results.mkdir()
    result = project.pytester.runpytest("--haico-results", str(results))
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    result.stdout.fnmatch_lines([f"rootdir: {project.root}", "configfile: pyproject.toml"])
    result.assert_outcomes(passed=2)


def test_experiments_in_the_next_word_without_a_configuration_lead_with_the_fix(
    campaign: CampaignProject, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The first-hour walk: no configuration file anywhere, `--haico-experiments DIR` from
    # another directory.
    (campaign.root / "pyproject.toml").unlink()
    campaign.arm("demo")
    campaign.simple_scripts("s1")
    below = campaign.root / "below"
    below.mkdir()
    monkeypatch.chdir(below)
    result = campaign.pytester.runpytest("--haico-experiments", "../experiments")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            "ERROR: haico: write --haico-experiments=../experiments (with '='): pytest read the "
            "next word, ../experiments, as a test path before haico's options were known, and "
            f"took the rootdir {campaign.root} instead of {below} from it"
        ]
    )
