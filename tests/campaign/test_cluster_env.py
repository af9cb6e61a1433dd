"""cluster.env reads as a shell would source it, and refuses what a shell would get wrong."""

from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path

import pytest

from pytest_haico.config.cluster_env import load_cluster_env
from pytest_haico.errors import ConfigError
from tests.fifos import plant_fifo, without_waiting

EXAMPLE = Path(__file__).parents[2] / "experiments" / "cluster.env.example"


def env_error(tmp_path: Path, text: str) -> str:
    path = tmp_path / "cluster.env"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_cluster_env(path)
    return str(caught.value)


def test_variables_expand_from_the_environment_and_earlier_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("USER", "ada")
    path = tmp_path / "cluster.env"
    path.write_text(
        "CLUSTER_WORK=/scratch/$USER/haico\n"
        'VLLM_VENV="${CLUSTER_WORK}/vllm-venv"\n'
        "SIF_DIR='/literal/$USER'\n"
        "HF_HOME=/cost/5$\n"
    )
    values = load_cluster_env(path).values
    assert values == {
        "CLUSTER_WORK": "/scratch/ada/haico",
        "VLLM_VENV": "/scratch/ada/haico/vllm-venv",
        "SIF_DIR": "/literal/$USER",
        "HF_HOME": "/cost/5$",
    }


@pytest.mark.parametrize("form", ["$USER", "${USER}"])
def test_an_unset_variable_names_file_line_and_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, form: str
) -> None:
    monkeypatch.delenv("USER", raising=False)
    message = env_error(tmp_path, f"PARTITION=gpu\nCLUSTER_WORK=/scratch/{form}/haico\n")
    pytest.LineMatcher([message]).fnmatch_lines(
        [
            f"{tmp_path}/cluster.env:2: CLUSTER_WORK: $USER is not set (or empty) in the "
            "environment; set it, or write the value out"
        ]
    )


@pytest.mark.parametrize(
    "value", ["/x/$(whoami)", "/x/`whoami`", "/x/${USER:-ada}", "/x/$1", '"/x/$(id -u)"']
)
def test_shell_expansions_beyond_variables_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("USER", "ada")
    message = env_error(tmp_path, f"CLUSTER_WORK={value}\n")
    pytest.LineMatcher([message]).fnmatch_lines(
        [
            "*cluster.env:1: CLUSTER_WORK: only $NAME and ${NAME} are expanded here; "
            "write the value out*"
        ]
    )


def test_an_empty_value_is_refused(tmp_path: Path) -> None:
    pytest.LineMatcher([env_error(tmp_path, "VLLM_VENV=\n")]).fnmatch_lines(
        ["*cluster.env:1: VLLM_VENV: empty value; remove the line to leave VLLM_VENV unset"]
    )


def test_the_example_loads_and_names_only_commands_that_exist(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("USER", "ada")
    site = load_cluster_env(EXAMPLE)
    assert site.get("CLUSTER_WORK") == "/scratch/ada/haico"
    commands = re.findall(r"`([^`]+)`", EXAMPLE.read_text())
    assert commands, "the example names how to build the vLLM venv"
    # The package's own commands (`haico env`) are installed beside this interpreter.
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    for command in commands:
        assert shutil.which(command.split()[0], path=path), f"{command!r}: no such command"


def test_a_fifo_in_place_of_cluster_env_is_refused_without_waiting(tmp_path: Path) -> None:
    fifo = plant_fifo(tmp_path / "cluster.env")
    with pytest.raises(ConfigError) as caught:
        without_waiting(lambda: load_cluster_env(fifo), fifo)
    assert f"cannot read cluster.env: {fifo} is a FIFO, not a regular file" in str(caught.value)
