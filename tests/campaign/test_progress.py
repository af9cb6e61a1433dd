"""The job log: a line per finished item, with the count and an ETA, when the output is not a
terminal; pytest's own output on a terminal, with -q and with -v; a haico failure's
explanation once, in a few lines."""

from __future__ import annotations

import re

import pytest

from tests.harness import CampaignProject

# `[ 3/11] demo plan-trip-r0 completed 0.4 s · 2 in flight · ETA 1 m 3 s`
SPAN = r"(?:\d+\.\d s|\d+ m \d+ s|\d+ h \d+ m)"
LINE = re.compile(
    rf"^\[ *(\d+)/(\d+)\] (\S+) (\S+) (\S+) ({SPAN}) · (\d+) in flight · ETA ({SPAN})$"
)


def job_log(lines: list[str]) -> list[tuple[int, int, str, str, str]]:
    """(done, total, arm, script-repeat, verdict) of each item line, in order."""
    return [(int(m[1]), int(m[2]), m[3], m[4], m[5]) for line in lines if (m := LINE.match(line))]


def five_items(campaign: CampaignProject) -> None:
    campaign.arm("demo")
    campaign.simple_scripts("a", "b", "c")
    campaign.scripts("d.yaml", "id: d\nturns:\n  - user: fail please\n")
    campaign.scripts("e.yaml", "id: e\nturns:\n  - user: infra down\n")


def test_a_job_log_has_one_line_per_finished_item_counting_to_the_total(
    campaign: CampaignProject,
) -> None:
    five_items(campaign)
    result = campaign.run()
    result.assert_outcomes(passed=3, failed=2)
    lines = result.stdout.lines
    assert job_log(lines) == [
        (1, 5, "demo", "a-r0", "completed"),
        (2, 5, "demo", "b-r0", "completed"),
        (3, 5, "demo", "c-r0", "completed"),
        (4, 5, "demo", "d-r0", "expectation_failed"),
        (5, 5, "demo", "e-r0", "infra_error"),
    ]
    result.stdout.fnmatch_lines(
        [
            "haico: 0 done in ledger, 5 to run (0 retries)",
            "[[]1/5[]] demo a-r0 completed *.* s · 0 in flight · ETA *.* s",
            "[[]5/5[]] demo e-r0 infra_error *.* s · 0 in flight · ETA 0.0 s",
            "*= FAILURES =*",
        ]
    )
    # No dots, no file name, no percentage: the lines are the progress.
    assert not [line for line in lines if line.startswith("experiments/test_conversations.py ")]
    assert not [line for line in lines if "[100%]" in line]


def test_the_job_log_counts_only_what_this_run_runs(campaign: CampaignProject) -> None:
    five_items(campaign)
    campaign.run()
    # Resumed: the three completed and the failed item are done; the infra error runs again.
    result = campaign.run()
    assert job_log(result.stdout.lines) == [(1, 1, "demo", "e-r0", "infra_error")]


def test_a_hand_written_test_and_an_unstarted_item_get_a_line_without_a_count(
    campaign: CampaignProject,
) -> None:
    campaign.arm("demo")
    campaign.simple_scripts("a", "b")
    campaign.write(
        "test_by_hand.py",
        """
        import pytest

        def test_by_hand():
            pass

        @pytest.mark.skip(reason="not today")
        def test_skipped():
            pass
        """,
    )
    result = campaign.run()
    result.stdout.fnmatch_lines(
        [
            "experiments/test_by_hand.py::test_by_hand passed *.* s",
            "experiments/test_by_hand.py::test_skipped skipped: not today",
            "[[]1/2[]] demo a-r0 completed *",
            "[[]2/2[]] demo b-r0 completed *",
        ],
        consecutive=True,
    )


@pytest.mark.parametrize("flag", ["-q", "-qq", "-v"])
def test_quiet_and_verbose_runs_show_pytests_own_output(
    campaign: CampaignProject, flag: str
) -> None:
    five_items(campaign)
    result = campaign.run(flag)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert job_log(result.stdout.lines) == []
    assert "haico: demo stack" not in result.stdout.str()
    if flag == "-v":
        result.stdout.fnmatch_lines(["*test_conversation?demo-a-r0? PASSED*"])
    else:
        result.stdout.fnmatch_lines(["...FF*[[]100%[]]"])


def test_progress_off_shows_pytests_dots(campaign: CampaignProject) -> None:
    five_items(campaign)
    result = campaign.run("--haico-progress", "off")
    assert job_log(result.stdout.lines) == []
    result.stdout.fnmatch_lines(["experiments/test_conversations.py ...FF*[[]100%[]]"])


def test_a_session_that_does_not_collect_the_experiments_keeps_pytests_output(
    campaign: CampaignProject,
) -> None:
    # This repository's own test suite: an experiments directory beside, tests elsewhere.
    five_items(campaign)
    campaign.pytester.makepyfile(test_plain="def test_one():\n    pass\n")
    result = campaign.pytester.runpytest("test_plain.py", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["test_plain.py .*"])
    assert not any(line.startswith("test_plain.py::test_one passed") for line in result.outlines)


@pytest.mark.subprocess
def test_a_terminal_shows_pytests_dots_and_no_job_log(campaign: CampaignProject) -> None:
    five_items(campaign)
    status, output = campaign.run_on_terminal("--color=no")
    assert status == pytest.ExitCode.TESTS_FAILED, output
    lines = output.splitlines()
    assert job_log(lines) == [], output
    dots = re.compile(r"experiments/test_conversations.py \.\.\.FF +\[100%\]$")
    assert any(dots.match(line) for line in lines), output


@pytest.mark.subprocess
def test_progress_lines_on_a_terminal_when_asked(campaign: CampaignProject) -> None:
    five_items(campaign)
    status, output = campaign.run_on_terminal("--color=no", "--haico-progress", "lines")
    assert status == pytest.ExitCode.TESTS_FAILED, output
    assert [entry[:2] for entry in job_log(output.splitlines())] == [(n, 5) for n in range(1, 6)]


def test_an_invalid_progress_mode_is_a_usage_error(campaign: CampaignProject) -> None:
    five_items(campaign)
    result = campaign.run("--haico-progress", "dots")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*haico: --haico-progress: invalid value 'dots'; valid: auto, lines, off"]
    )


def test_an_infra_error_is_its_message_without_source_lines(
    campaign: CampaignProject, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")  # the short summary's line in full
    five_items(campaign)
    result = campaign.run("-k", "e-r0")
    text = result.stdout.str()
    result.stdout.fnmatch_lines(
        [
            "*_ test_conversation?demo-e-r0? _*",
            "InfraError: backend unreachable: connection refused",
            "*= haico =*",
        ],
        consecutive=False,
    )
    assert "raise InfraError" not in text
    assert "def test_conversation" not in text
    assert text.count("backend unreachable: connection refused") == 1
    result.stdout.fnmatch_lines(
        [
            "FAILED infra_error experiments/test_conversations.py::test_conversation[demo-e-r0]"
            " - InfraError"
        ]
    )


def test_tb_long_shows_pytests_whole_traceback(campaign: CampaignProject) -> None:
    five_items(campaign)
    result = campaign.run("-k", "e-r0", "--tb=long")
    result.stdout.fnmatch_lines(
        [
            "*def test_conversation(haico_item):*",
            ">*raise InfraError(*",
            "E*InfraError: backend unreachable: connection refused",
        ]
    )


def test_a_users_own_assertion_is_shown_as_pytest_shows_it(campaign: CampaignProject) -> None:
    five_items(campaign)
    result = campaign.run("-k", "d-r0")
    result.stdout.fnmatch_lines(
        [
            ">*assert not text.startswith(?fail?), ?the model said something else?",
            "E*AssertionError: the model said something else",
        ]
    )


# A stand-in for the conversation fixture: what the explanation is made of, without a stack.
FAKE_CONVERSATION = """
import pytest


class FakeConversation:
    verdict = "recursion_limit"
    steps = 12

    def explain(self):
        return "demo-{id}: recursion_limit after 2 turn(s)\\n  turn 1: hit the recursion limit (12)"


@pytest.fixture
def haico_conversation(haico_item):
    return FakeConversation()
"""

EXPLAINED_MODULE = """
def test_conversation(haico_conversation, haico_item):
    if haico_item.script.id == "own":
        assert haico_conversation.steps < 10, "too many steps"
    assert haico_conversation.verdict == "completed", haico_conversation.explain()
"""


def test_a_failed_items_explanation_appears_once_in_a_few_lines(
    campaign: CampaignProject,
) -> None:
    campaign.arm("demo")
    campaign.simple_scripts("loops", "own")
    campaign.write("conftest.py", FAKE_CONVERSATION)
    campaign.write("test_conversations.py", EXPLAINED_MODULE)
    result = campaign.run()
    result.assert_outcomes(failed=2)
    text = result.stdout.str()
    # The fake's explanation names no item: count its second line.
    assert text.count("turn 1: hit the recursion limit (12)") == 1, text
    result.stdout.fnmatch_lines(
        [
            "*_ test_conversation?demo-loops-r0? _*",
            "demo-{id}: recursion_limit after 2 turn(s)",
            "  turn 1: hit the recursion limit (12)",
            "*_ test_conversation?demo-own-r0? _*",
        ],
        consecutive=True,
    )
    # The user's own assertion, in the same module, as pytest shows it.
    result.stdout.fnmatch_lines(["E*AssertionError: too many steps", "E*assert 12 < 10"])


def test_the_short_summary_keeps_the_verdict_on_a_narrow_terminal(
    campaign: CampaignProject, monkeypatch: pytest.MonkeyPatch
) -> None:
    # pytest cuts a summary line's message to the terminal's width (here the whole of it):
    # the verdict is in the status word, which it never cuts.
    monkeypatch.setenv("COLUMNS", "60")
    five_items(campaign)
    result = campaign.run("-k", "e-r0", "-rf")
    result.stdout.fnmatch_lines(
        ["FAILED infra_error experiments/test_conversations.py::test_conversation[[]demo-e-r0[]]*"]
    )


def test_verbose_lines_name_the_verdict_of_a_failed_item(campaign: CampaignProject) -> None:
    five_items(campaign)
    result = campaign.run("-v", "-k", "e-r0 or a-r0")
    result.stdout.fnmatch_lines(
        [
            "*::test_conversation[[]demo-a-r0[]] PASSED*",
            "*::test_conversation[[]demo-e-r0[]] FAILED infra_error*",
        ],
        consecutive=False,
    )
