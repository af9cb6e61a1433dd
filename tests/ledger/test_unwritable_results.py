"""A read-only or full results file system is a usage error before anything starts, naming
the directory, the error and the fix; it never leaves an empty claim.json behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.harness import CampaignProject
from tests.ledger.conftest import Mount, fill

FIX = (
    "Use a writable file system with free space: --haico-results DIR (ini haico_results, env "
    "PYTEST_HAICO_RESULTS), or CLUSTER_WORK (results go to $CLUSTER_WORK/results)"
)


def files_under(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and p.name != "filler.bin"]


def test_a_read_only_results_file_system_is_a_usage_error(
    campaign: CampaignProject, tmpfs: Mount
) -> None:
    campaign.arm("demo")
    campaign.simple_scripts("a", "b")
    results = tmpfs(campaign.root / "ro-results", read_only=True)
    result = campaign.run("--haico-results", str(results))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            f"ERROR: haico: cannot write to the results directory {results}: {results}/default: "
            f"[[]Errno 30[]] Read-only file system on the file system mounted at {results} "
            f"(tmpfs from tmpfs, device *). {FIX}"
        ]
    )
    result.assert_outcomes()


def test_a_full_results_file_system_is_a_usage_error_and_leaves_no_claim_json(
    campaign: CampaignProject, tmpfs: Mount
) -> None:
    campaign.arm("demo")
    campaign.simple_scripts("a", "b")
    results = tmpfs(campaign.root / "full-results")
    fill(results)
    result = campaign.run("--haico-results", str(results))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            f"ERROR: haico: cannot write to the results directory {results}: "
            f"{results}/default/demo/runs: [[]Errno 28[]] No space left on device on the file "
            f"system mounted at {results} (tmpfs from tmpfs, device *). {FIX}"
        ]
    )
    result.assert_outcomes()
    assert files_under(results) == [], "a claim.json (or its temporary) was left behind"
    assert list((results / "default" / "demo" / "runs").iterdir()) == []
