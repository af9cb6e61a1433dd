"""langsmith's pytest plugin (pulled in by the stand-ins' LangChain) costs about a second
at every start: a campaign session never loads it, any other session keeps it."""

from __future__ import annotations

import importlib.metadata
import shutil

import pytest

from tests.harness import CampaignProject

pytestmark = pytest.mark.skipif(
    not importlib.metadata.entry_points(group="pytest11", name="langsmith_plugin"),
    reason="langsmith is not installed (the standins extra installs it)",
)

# The user's own project: no ini of ours, nothing that turns langsmith off.
PYPROJECT = '[tool.pytest.ini_options]\nasyncio_default_fixture_loop_scope = "function"\n'

# What the session had at its end (pytest_unconfigure runs even when configure refused).
CONFTEST = """
import sys

def pytest_unconfigure(config):
    with open("langsmith.txt", "w") as out:
        registered = config.pluginmanager.has_plugin("langsmith_plugin")
        out.write(f"registered={registered} imported={'langsmith' in sys.modules}\\n")
"""


@pytest.fixture
def project(campaign: CampaignProject) -> CampaignProject:
    """The campaign project as a user writes it: no `-p no:langsmith_plugin` anywhere."""
    campaign.pytester.makepyprojecttoml(PYPROJECT)
    campaign.pytester.makeconftest(CONFTEST)
    campaign.arm("demo")
    campaign.simple_scripts("greet")
    return campaign


def what_langsmith_was(project: CampaignProject) -> str:
    return (project.root / "langsmith.txt").read_text().strip()


def test_a_campaign_session_does_not_register_langsmiths_plugin(project: CampaignProject) -> None:
    result = project.run()
    result.assert_outcomes(passed=1)
    result.stdout.no_fnmatch_line("plugins:*langsmith*")
    assert what_langsmith_was(project).startswith("registered=False")


@pytest.mark.subprocess
def test_a_bad_arm_file_is_refused_without_importing_langsmith(project: CampaignProject) -> None:
    project.arm("demo", "[modle]\nserved_name = 'demo'\n")
    result = project.run_subprocess()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*arms/demo.toml: modle: unknown key*"])
    assert what_langsmith_was(project) == "registered=False imported=False"


def test_dash_p_langsmith_plugin_keeps_it_in_a_campaign(project: CampaignProject) -> None:
    project.run("-p", "langsmith_plugin").assert_outcomes(passed=1)
    assert what_langsmith_was(project).startswith("registered=True")


def test_a_session_outside_the_campaign_keeps_langsmiths_plugin(
    project: CampaignProject,
) -> None:
    # A test suite of the user's own next to experiments/, e.g. one that uses
    # @pytest.mark.langsmith: the run collects nothing from the campaign.
    project.pytester.makepyfile(
        test_own="import pytest\n\n@pytest.mark.langsmith\ndef test_own():\n    pass\n"
    )
    result = project.pytester.runpytest("test_own.py", "--strict-markers", "--collect-only")
    assert result.ret == pytest.ExitCode.OK
    assert what_langsmith_was(project).startswith("registered=True")


def test_a_session_without_experiments_keeps_langsmiths_plugin(
    project: CampaignProject,
) -> None:
    shutil.rmtree(project.experiments)
    project.pytester.makepyfile(test_own="def test_own():\n    pass\n")
    project.pytester.runpytest("test_own.py").assert_outcomes(passed=1)
    assert what_langsmith_was(project).startswith("registered=True")


def test_dash_p_no_langsmith_plugin_stays_blocked_outside_a_campaign(
    project: CampaignProject,
) -> None:
    project.pytester.makepyfile(test_own="def test_own():\n    pass\n")
    result = project.pytester.runpytest("test_own.py", "-p", "no:langsmith_plugin")
    result.assert_outcomes(passed=1)
    assert what_langsmith_was(project).startswith("registered=False")


@pytest.mark.subprocess
def test_langsmith_output_still_parses_outside_a_campaign(project: CampaignProject) -> None:
    # Only langsmith's plugin knows this option; pytest parses it before configure time.
    project.pytester.makepyfile(test_own="def test_own():\n    pass\n")
    result = project.pytester.runpytest_subprocess("test_own.py", "--langsmith-output")
    assert "unrecognized arguments" not in result.stderr.str()
