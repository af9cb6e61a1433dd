"""Helpers of the gates' tests: a scratch vLLM venv and a fake `scontrol` (the stand-in
servers and the tmpfs mounts are the shared fixtures of tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import Mount

__all__ = ["Mount"]

HERMES_PARSER = """\
from vllm.entrypoints.openai.tool_parsers.abstract_tool_parser import ToolParserManager


@ToolParserManager.register_module("hermes")
class Hermes2ProToolParser:
    pass
"""
MISTRAL_PARSER = """\
@ToolParserManager.register_module(["mistral", "mistral_v2"])
class MistralToolParser:
    pass
"""
METADATA = "Metadata-Version: 2.1\nName: vllm\nVersion: {version}\nSummary: stand-in\n"


def make_vllm_venv(
    root: Path,
    *,
    version: str | None = "0.11.0",
    parsers: dict[str, str] | None = None,
    parser_dir: str = "entrypoints/openai/tool_parsers",
    executable: bool = True,
) -> Path:
    """A virtualenv's files as far as the gates read them: bin/vllm, the vllm package with
    its parser modules (text only), and vllm-<version>.dist-info."""
    site = root / "lib" / "python3.11" / "site-packages"
    package = site / "vllm"
    (package / parser_dir).mkdir(parents=True)
    (package / "__init__.py").write_text("raise ImportError('never imported by a gate')\n")
    modules = (
        {"hermes_tool_parser.py": HERMES_PARSER, "mistral_tool_parser.py": MISTRAL_PARSER}
        if parsers is None
        else parsers
    )
    for name, text in modules.items():
        (package / parser_dir / name).write_text(text)
    if version is not None:
        info = site / f"vllm-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(METADATA.format(version=version))
    if executable:
        (root / "bin").mkdir()
        (root / "bin" / "vllm").write_text("#!/bin/sh\nexit 0\n")
        (root / "bin" / "vllm").chmod(0o755)
    return root


def make_fake_scontrol(directory: Path, *, stdout: str, status: int = 0) -> Path:
    """A directory holding `scontrol` that prints `stdout` and exits `status`, recording its
    arguments in `scontrol.args`; put it on PATH."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "hostnames.txt").write_text(stdout)
    script = directory / "scontrol"
    script.write_text(
        "#!/bin/sh\n"
        f'printf "%s\\n" "$@" > "{directory}/scontrol.args"\n'
        f'/bin/cat "{directory}/hostnames.txt"\n'
        f"exit {status}\n"
    )
    script.chmod(0o755)
    return directory
