"""Slurm's job variables become run ids and file names: anything but digits is refused."""

from __future__ import annotations

import pytest

from pytest_haico.config.slurm import SlurmJob
from pytest_haico.errors import ConfigError
from tests.harness import CampaignProject

VARIABLES = ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_RESTART_COUNT")


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        *((variable, "../../escape") for variable in VARIABLES),
        ("SLURM_JOB_ID", "a/b"),
        ("SLURM_JOB_ID", "12 "),
        ("SLURM_JOB_ID", "١٢"),  # Unicode digits: str.isdigit() alone accepts them
    ],
)
def test_a_malformed_slurm_variable_is_a_usage_error_before_anything_is_written(
    campaign: CampaignProject, monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    campaign.arm("demo")
    campaign.simple_scripts("a")
    # A well-formed job around the bad variable: each variable is checked on its own.
    for name, good in zip(VARIABLES, ("77", "70", "3", "1"), strict=True):
        monkeypatch.setenv(name, good)
    monkeypatch.setenv(variable, value)
    result = campaign.run("--haico-shard", "0/1")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            f"ERROR: haico: environment variable {variable}: {value!r} is not a Slurm job "
            "number (digits only, as Slurm sets it); unset it, or run inside the Slurm job it "
            "belongs to"
        ]
    )
    assert not (campaign.root / "results").exists()


def test_slurm_variables_of_digits_make_the_job() -> None:
    job = SlurmJob.from_environ(
        {"SLURM_JOB_ID": "77", "SLURM_ARRAY_JOB_ID": "70", "SLURM_ARRAY_TASK_ID": "3"}
    )
    assert (job.job_id, job.array_job_id, job.array_task_id, job.restart_count) == (
        "77",
        "70",
        "3",
        0,
    )
    assert job.key == "70_3"
    assert SlurmJob.from_environ({"SLURM_JOB_ID": ""}).key is None


def test_a_very_long_value_is_cut_in_the_message() -> None:
    with pytest.raises(ConfigError) as refused:
        SlurmJob.from_environ({"SLURM_JOB_ID": "x" * 500})
    assert str(refused.value).startswith(
        f"environment variable SLURM_JOB_ID: {'x' * 64 + '...'!r} is not a Slurm job number"
    )
