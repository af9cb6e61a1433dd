"""The attack's accepted-but-invalid inputs and hangs (issue 24): each is a one-line usage
error naming the file or option, the field and the fix."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pytest_haico.cli.main import main
from pytest_haico.config.experiment import iter_scripts, load_arm
from pytest_haico.errors import ConfigError


def _arm_error(path: Path) -> str:
    with pytest.raises(ConfigError) as caught:
        load_arm(path)
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_an_arm_file_that_is_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "demo.toml"
    os.mkfifo(fifo)
    assert _arm_error(fifo) == (
        f"{fifo}: the arm file is a FIFO, not a regular file: make it a regular TOML file"
    )


@pytest.mark.parametrize("text", ["", "\n  \n", "# an arm to come\n"])
def test_an_arm_file_that_sets_no_key_is_refused(tmp_path: Path, text: str) -> None:
    arm = tmp_path / "demo.toml"
    arm.write_text(text)
    assert _arm_error(arm) == (
        f'{arm}: the arm file sets no key: write at least description = "..."'
    )


def test_a_script_file_that_is_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "s.yaml"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match="the script file is a FIFO, not a regular file"):
        list(iter_scripts(fifo))


@pytest.mark.parametrize(
    ("text", "field", "value"),
    [
        ('[slurm]\ntime = "banana"\n', "slurm.time", "'banana'"),
        (
            '[slurm]\ntime_per_stratum = { long = "1:2:3:4:5" }\n',
            "slurm.time_per_stratum.long",
            "'1:2:3:4:5'",
        ),
    ],
)
def test_a_slurm_time_that_is_no_time_limit_is_refused_naming_the_value_once(
    tmp_path: Path, text: str, field: str, value: str
) -> None:
    arm = tmp_path / "demo.toml"
    arm.write_text(text)
    assert _arm_error(arm) == (
        f"{arm}: {field}: not a Slurm time limit: use MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, "
        f"D-HH:MM:SS or 'infinite', got {value}"
    )


def test_a_slurm_time_limit_is_accepted(tmp_path: Path) -> None:
    arm = tmp_path / "demo.toml"
    arm.write_text('[slurm]\ntime = "1-02:00:00"\n')
    slurm = load_arm(arm).slurm
    assert slurm is not None and slurm.time == "1-02:00:00"


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (
            ["stack", "up", "demo", "--dump-interval", "-1"],
            "argument --dump-interval: '-1' is not a number of seconds >= 0",
        ),
        (
            ["stack", "up", "demo", "--dump-interval", "inf"],
            "argument --dump-interval: 'inf' is not a number of seconds >= 0",
        ),
        (
            ["cost", "c", "--concurrency", "100000000000000000000"],
            "argument --concurrency: '100000000000000000000' is more than 1024, the bound",
        ),
        (["cost", "c", "--concurrency", "1e20"], "argument --concurrency: '1e20' is not a whole"),
    ],
)
def test_out_of_range_options_are_usage_errors(
    capsys: pytest.CaptureFixture[str], argv: list[str], expected: str
) -> None:
    with pytest.raises(SystemExit) as caught:
        main(argv)
    assert caught.value.code == 2
    assert expected in capsys.readouterr().err


@pytest.mark.parametrize(
    ("campaign", "expected"),
    [
        ("", "haico: campaign: empty; give the campaign's name, or its directory"),
        ("../../../etc", "haico: campaign: '../../../etc' climbs out with '..'"),
    ],
)
def test_submit_refuses_an_empty_or_climbing_campaign(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    campaign: str,
    expected: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["submit", campaign, "--stage", "smoke"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(expected)
    assert err.count("\n") == 1


def test_a_yaml_file_over_its_bound_is_refused_before_parsing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pytest_haico.config import documents

    monkeypatch.setattr(documents, "MAX_YAML_FILE_BYTES", 100)
    scripts = tmp_path / "many.yaml"
    scripts.write_text("".join(f"- id: s{i}\n  turns: [{{user: hi}}]\n" for i in range(10)))
    with pytest.raises(ConfigError) as caught:
        list(iter_scripts(scripts))
    assert str(caught.value) == (
        f"{scripts}: the YAML file has 310 characters, more than 100 (PyYAML would take "
        "minutes): write a generated set as JSONL, one script a line"
    )
