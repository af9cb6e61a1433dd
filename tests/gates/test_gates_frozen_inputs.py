"""Gate 8 for a job of `haico submit`: the inputs it runs are the ones the submission froze
(their digest is $HAICO_INPUTS_DIGEST)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_haico.config.frozen import inputs_digest
from pytest_haico.gates.filesystem import check_frozen_inputs

FIX = (
    "the frozen inputs of this submission were edited after `haico submit`: restore them, "
    "or submit again (a new submission) to run the edit"
)


@pytest.fixture
def frozen(tmp_path: Path) -> tuple[Path, Path]:
    """A submission's frozen experiments directory and cluster.env."""
    experiments = tmp_path / "submissions" / "abc" / "experiments"
    (experiments / "scripts").mkdir(parents=True)
    (experiments / "scripts" / "a.yaml").write_text("id: a\nturns:\n  - user: hi\n")
    site = tmp_path / "submissions" / "abc" / "cluster.env"
    site.write_text("CLUSTER_WORK=/work\n")
    return experiments, site


def test_the_inputs_of_the_submission_pass(frozen: tuple[Path, Path]) -> None:
    experiments, site = frozen
    digest = inputs_digest(experiments, site)
    result = check_frozen_inputs(experiments, site, expected=digest)
    assert result.passed, result.failure_line
    assert result.detail == f"the frozen inputs of the submission ({digest[:19]})"


def test_an_edit_after_the_digest_fails_naming_both_digests_and_the_directory(
    frozen: tuple[Path, Path],
) -> None:
    experiments, site = frozen
    submitted = inputs_digest(experiments, site)
    (experiments / "scripts" / "a.yaml").write_text("id: a\nturns:\n  - user: hello\n")
    now = inputs_digest(experiments, site)
    result = check_frozen_inputs(experiments, site, expected=submitted)
    assert not result.passed
    assert result.failure_line == (
        f"gate inputs_present failed: the inputs {experiments} and {site} digest to "
        f"{now[:19]}, not to {submitted[:19]} ($HAICO_INPUTS_DIGEST, taken at submission); "
        f"{FIX}"
    )


def test_a_site_file_edited_or_gone_fails(frozen: tuple[Path, Path]) -> None:
    experiments, site = frozen
    submitted = inputs_digest(experiments, site)
    assert not check_frozen_inputs(experiments, None, expected=submitted).passed
    site.write_text("CLUSTER_WORK=/elsewhere\n")
    assert not check_frozen_inputs(experiments, site, expected=submitted).passed


@pytest.mark.parametrize(
    "value",
    ["", "abc", "sha256:" + "A" * 64, "sha256:" + "0" * 63, "md5:" + "0" * 32, "x" * 200],
)
def test_a_malformed_digest_fails_with_its_own_fix(frozen: tuple[Path, Path], value: str) -> None:
    experiments, site = frozen
    result = check_frozen_inputs(experiments, site, expected=value)
    assert not result.passed
    shown = value if len(value) <= 80 else value[:77] + "..."
    assert result.failure_line == (
        f"gate inputs_present failed: HAICO_INPUTS_DIGEST={shown!r} is not a digest of frozen "
        "inputs (sha256: and 64 lower-case hex digits); `haico submit` sets "
        "HAICO_INPUTS_DIGEST for the jobs it submits: submit again, or unset it to run these "
        "inputs without the check"
    )


def test_inputs_that_cannot_be_digested_fail_naming_the_file(frozen: tuple[Path, Path]) -> None:
    experiments, site = frozen
    submitted = inputs_digest(experiments, site)
    dangling = experiments / "scripts" / "b.yaml"
    dangling.symlink_to(experiments / "gone.yaml")
    result = check_frozen_inputs(experiments, site, expected=submitted)
    assert not result.passed
    assert result.failure_line == (
        f"gate inputs_present failed: cannot digest the frozen inputs {experiments} and "
        f"{site}: {dangling}: is a dangling symlink: restore its target or remove it; {FIX} "
        "(or repair what the message names)"
    )
