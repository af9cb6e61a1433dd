"""Fixtures of the gates' tests: real stand-in servers (shared per session), a scratch vLLM
venv, a fake `scontrol`, and tiny tmpfs mounts (full, or read-only)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.standins.standin_procs import BackendServers, Launcher, LlmServers

Mount = Callable[..., Path]

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


@pytest.fixture(scope="session")
def standin_launcher(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Launcher]:
    """Session-wide cache of running stand-ins, started and stopped by the stack's orchestrator."""
    launcher = Launcher(
        tmp_path_factory.mktemp("gates-standin-logs"), tmp_path_factory.mktemp("gates-state")
    )
    try:
        yield launcher
    finally:
        launcher.stop_all()


@pytest.fixture(scope="session")
def llm_server(standin_launcher: Launcher) -> LlmServers:
    """``llm_server(persona, tools=False, ...)``: a running stand-in vLLM, shared per arguments."""
    return LlmServers(standin_launcher)


@pytest.fixture(scope="session")
def backend_server(standin_launcher: Launcher, postgres_dsn: str) -> BackendServers:
    """``backend_server(substitute_model=...)``: a running stand-in backend, own database."""
    return BackendServers(standin_launcher, postgres_dsn)


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


@pytest.fixture
def tmpfs() -> Iterator[Mount]:
    """`tmpfs(path, size="64k", read_only=False)` mounts a small tmpfs at `path` (root only);
    every mount is undone at teardown."""
    mounted: list[Path] = []

    def mount(path: Path, *, size: str = "64k", read_only: bool = False) -> Path:
        if os.geteuid() != 0:
            pytest.skip("mounting a tmpfs needs root")
        path.mkdir(parents=True, exist_ok=True)
        options = f"size={size},mode=0755" + (",ro" if read_only else "")
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
        mounted.append(path)
        return path

    yield mount
    for path in reversed(mounted):
        subprocess.run(["umount", "--lazy", str(path)], check=False)
