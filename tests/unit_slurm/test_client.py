"""How a Slurm client command runs: an argv, the allow-listed environment, a bounded wait,
and an answer or an error that says what went wrong."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from pytest_haico.slurm import client
from tests.unit_slurm.commands import stand_ins


def test_commands_run_as_an_argv_without_a_shell() -> None:
    code = "import sys; print(sys.argv[1])"
    answer = client.run([sys.executable, "-c", code, "$HOME;"], environ={}, timeout_s=10)
    assert (answer.ok, answer.stdout) == (True, "$HOME;\n")


def test_a_command_sees_only_the_allow_listed_environment(tmp_path: Path) -> None:
    env = stand_ins(tmp_path, squeue="/usr/bin/env")
    given = {
        **env,
        "SLURM_CONF": "/etc/slurm/test.conf",  # what slurmd sets inside a job
        "LC_ALL": "C",
        "HOME": "/home/u",
        "SLURM_TIME_FORMAT": "relative",  # would change every timestamp the parsers read
        "SQUEUE_FORMAT": "%i",
        "SLURM_MEM_PER_CPU": "4000",
        "OPENAI_API_KEY": "sk-secret",
    }
    seen = dict(line.split("=", 1) for line in client.run(["squeue"], environ=given).stdout.split())
    seen.pop("PWD", None)
    seen.pop("SHLVL", None)
    seen.pop("_", None)  # what bash sets itself
    assert seen == {
        "PATH": env["PATH"],
        "TZ": "America/New_York",
        "SLURM_CONF": "/etc/slurm/test.conf",
        "LC_ALL": "C",
        "HOME": "/home/u",
    }


def test_a_missing_command_is_not_run_and_says_so(tmp_path: Path) -> None:
    with pytest.raises(client.NotRun) as raised:
        client.run(["squeue", "-h"], environ={"PATH": str(tmp_path)})
    assert str(raised.value) == (
        "squeue is not on PATH: run haico where Slurm's client commands are (a login node of "
        "the cluster), or add them to PATH"
    )
    assert raised.value.brief == "squeue not found"


def test_a_failing_command_answers_with_its_status_and_what_it_said(tmp_path: Path) -> None:
    env = stand_ins(
        tmp_path, sinfo='echo "first" >&2; echo "sinfo: error: no controller" >&2; exit 3'
    )
    answer = client.run(["sinfo", "-h", "-o", "%P %l"], environ=env)
    assert (answer.ok, answer.returncode, answer.said) == (False, 3, "sinfo: error: no controller")
    with pytest.raises(client.CommandFailed) as raised:
        answer.checked()
    assert str(raised.value) == "`sinfo -h ...` failed (exit 3): sinfo: error: no controller"


def test_a_command_that_does_not_answer_in_time_is_killed(tmp_path: Path) -> None:
    env = stand_ins(tmp_path, squeue="exec /bin/sleep 30")
    with pytest.raises(client.NoAnswer) as raised:
        client.run(["squeue"], environ=env, timeout_s=0.5)
    assert str(raised.value) == (
        "squeue did not answer within 0 s: is slurmctld reachable? (try `scontrol ping`)"
    )
    assert raised.value.brief == "no answer within 0.5 s"


def test_the_version_is_scontrols_first_line_or_none(tmp_path: Path) -> None:
    env = stand_ins(tmp_path, scontrol="echo; echo 'slurm 22.05.8'; echo more")
    assert client.version(env) == "slurm 22.05.8"
    assert (tmp_path / "scontrol.argv").read_text().split() == ["--version"]
    assert client.version({"PATH": str(tmp_path / "nowhere")}) is None
    assert client.version(stand_ins(tmp_path, scontrol="echo 'slurm 22.05.8'; exit 1")) is None
