"""Retries and reruns: an attempt after an infrastructure failure is a retry; a record of an
item that was already done (a --haico-no-resume run) is a deliberate rerun, not a retry."""

from __future__ import annotations

import pytest

from pytest_haico.cli.main import main
from pytest_haico.report.data import build_report
from pytest_haico.results import FIRST, RERUN, RETRY, load_results
from tests.harness import CampaignProject


def report_row(capsys: pytest.CaptureFixture[str], campaign: CampaignProject) -> dict[str, str]:
    """The terminal report's row of its one arm × stratum, by column (right-aligned cells
    end where their heading ends)."""
    capsys.readouterr()
    assert main(["report", str(campaign.root / "results" / "default")]) == 0
    head, row = capsys.readouterr().out.splitlines()[2:4]
    cells: dict[str, str] = {}
    start = head.index("items")
    for label in (
        "items",
        "turns",
        "median",
        "p95",
        "tokens in",
        "tokens out",
        "retries",
        "reruns",
    ):
        end = head.index(label, start) + len(label)
        cells[label], start = row[start:end].strip(), end
    return cells


def test_a_no_resume_rerun_counts_as_reruns_not_retries(
    campaign: CampaignProject, capsys: pytest.CaptureFixture[str]
) -> None:
    campaign.arm("demo")
    campaign.simple_scripts("a", "b")
    campaign.run().assert_outcomes(passed=2)
    campaign.run("--haico-no-resume").assert_outcomes(passed=2)

    results = load_results(campaign.root / "results" / "default")
    assert results.attempt_kinds() == [FIRST, FIRST, RERUN, RERUN]
    [cell] = build_report(results).cells
    assert (cell.items, cell.retries, cell.reruns) == (2, 0, 2)
    row = report_row(capsys, campaign)
    assert (row["items"], row["retries"], row["reruns"]) == ("2", "0", "2")
    frame = results.frame()
    assert (list(frame["retry"]), list(frame["rerun"])) == ([False] * 4, [False] * 2 + [True] * 2)


def test_an_attempt_after_an_infra_error_is_a_retry_in_any_later_run(
    campaign: CampaignProject, capsys: pytest.CaptureFixture[str]
) -> None:
    campaign.arm("demo")
    campaign.simple_scripts("a")
    campaign.scripts("e.yaml", "id: e\nturns:\n  - user: infra down\n")
    campaign.run()  # a completed, e an infra error
    campaign.run()  # resumed: e again (an infra error again)
    campaign.run("--haico-no-resume")  # a deliberately again; e after its infra error

    results = load_results(campaign.root / "results" / "default")
    kinds = [
        (r.script, r.verdict, k)
        for r, k in zip(results.records, results.attempt_kinds(), strict=True)
    ]
    assert kinds == [
        ("a", "completed", FIRST),
        ("e", "infra_error", FIRST),
        ("e", "infra_error", RETRY),
        ("a", "completed", RERUN),
        ("e", "infra_error", RETRY),
    ]
    [cell] = build_report(results).cells
    assert (cell.items, cell.retries, cell.reruns) == (2, 2, 1)
    row = report_row(capsys, campaign)
    assert (row["retries"], row["reruns"]) == ("2", "1")
