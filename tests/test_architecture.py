"""The package's parts import each other one way only (see `pytest_haico/__init__.py`)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import pytest_haico

PACKAGE = Path(pytest_haico.__file__).parent
SHARED = {"pytest_haico", "pytest_haico.errors", "pytest_haico.redact"}

# part -> the parts it may import (besides itself and the shared helpers)
ALLOWED: dict[str, set[str]] = {
    "config": set(),
    "ledger": {"config"},
    "driver": {"config", "ledger.records", "ledger.verdicts"},
    "stack": {"config"},
    "slurm": {"config"},
    "gates": {"config", "ledger", "slurm"},
    "provenance": {"config", "stack", "slurm"},
    "runner": {"config", "ledger", "driver", "stack", "provenance", "gates", "slurm"},
    "campaign": {"config", "ledger", "driver", "stack", "runner", "provenance", "gates", "slurm"},
    # The public results API (`pytest_haico.results`, a package): what the report, the
    # cost model and the command line read campaigns with. It reads the ledgers through
    # the ledger's format (neither imports pydantic: the report's start-up depends on it).
    "results": {"config", "ledger.format", "ledger.verdicts"},
    "report": {"config", "ledger.format", "ledger.verdicts", "results", "slurm"},
    # A submission sizes its arrays with the cost model.
    "submit": {"config", "ledger", "results", "report", "slurm"},
    "kept": {"config", "ledger", "stack", "provenance", "slurm"},
    "cli": {"config", "ledger", "results", "report", "submit", "kept", "slurm"},
    "standins": set(),
}
# Packages whose own `__init__` belongs to their part (the results API's is its public face);
# the top-level modules (plugin.py, fixtures.py) are pytest's entry points and see everything.
TOP_LEVEL_PARTS = {"results": "results"}


def _part(module: str) -> str | None:
    """The part a `pytest_haico.*` module belongs to, or None for a top-level module."""
    parts = module.split(".")
    if len(parts) >= 3 and parts[1] in ALLOWED:
        return parts[1]
    if len(parts) == 2 and parts[1] in TOP_LEVEL_PARTS:
        return TOP_LEVEL_PARTS[parts[1]]
    return None


def _imports(path: Path) -> list[tuple[int, str]]:
    """Every `pytest_haico` module the file imports, at any depth (lazy imports too)."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [
                (node.lineno, a.name) for a in node.names if a.name.startswith("pytest_haico")
            ]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "pytest_haico":
                # `from pytest_haico import x`: a submodule or a name of the root package.
                found += [
                    (node.lineno, f"pytest_haico.{a.name}")
                    if (PACKAGE / a.name).is_dir() or (PACKAGE / f"{a.name}.py").is_file()
                    else (node.lineno, "pytest_haico")
                    for a in node.names
                ]
            elif node.module.startswith("pytest_haico."):
                found.append((node.lineno, node.module))
    return found


def _is_allowed(importer: str, imported: str) -> bool:
    if imported in SHARED:
        return True
    part = _part(importer)
    if part is None:
        return True  # plugin.py and fixtures.py: pytest's entry points see everything
    target = imported.removeprefix("pytest_haico.")
    if target.split(".")[0] == part:
        return True
    return any(target == allowed or target.startswith(allowed + ".") for allowed in ALLOWED[part])


def _modules() -> list[tuple[str, Path]]:
    modules = []
    for path in sorted(PACKAGE.rglob("*.py")):
        dotted = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        modules.append((dotted.removesuffix(".__init__"), path))
    return modules


@pytest.mark.parametrize(("module", "path"), _modules(), ids=[m for m, _ in _modules()])
def test_module_imports_only_what_its_part_may(module: str, path: Path) -> None:
    crossing = [
        f"{path.relative_to(PACKAGE.parent)}:{line}: {module} imports {imported}"
        for line, imported in _imports(path)
        if not _is_allowed(module, imported)
    ]
    assert not crossing, "\n".join(crossing)


def test_the_rule_catches_a_crossing_import() -> None:
    assert not _is_allowed("pytest_haico.ledger.recorder", "pytest_haico.driver.conversation")
    assert not _is_allowed("pytest_haico.driver.judge", "pytest_haico.stack.service")
    assert not _is_allowed("pytest_haico.stack.postgres", "pytest_haico.standins.llm")
    assert not _is_allowed("pytest_haico.standins.llm", "pytest_haico.config.settings")
    assert not _is_allowed("pytest_haico.config.items", "pytest_haico.ledger.records")
    assert _is_allowed("pytest_haico.driver.judge", "pytest_haico.ledger.verdicts")
    assert _is_allowed("pytest_haico.report.terminal", "pytest_haico.results")
    assert not _is_allowed("pytest_haico.results", "pytest_haico.ledger.jsonl")
    assert _is_allowed("pytest_haico.results.reader", "pytest_haico.ledger.format")
    assert not _is_allowed("pytest_haico.report.item_costs", "pytest_haico.ledger.records")
    assert not _is_allowed("pytest_haico.ledger.resume", "pytest_haico.results")
    assert not _is_allowed("pytest_haico.driver.judge", "pytest_haico.ledger.recorder")


def _readme_table() -> dict[str, set[str]]:
    """README's import table: part -> the parts it may import."""
    text = (PACKAGE.parent / "README.md").read_text()
    start = text.index("<!-- import table")
    end = text.index("<!-- end of import table -->")
    table: dict[str, set[str]] = {}
    for line in text[start:end].splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[0].startswith("`"):
            continue
        may = set() if cells[2] == "nothing" else {c.strip(" `") for c in cells[2].split(",")}
        table[cells[0].strip("`")] = may
    return table


def test_the_readme_import_table_is_the_rule() -> None:
    assert _readme_table() == ALLOWED


def test_every_part_is_a_folder_of_the_package() -> None:
    folders = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    assert folders == set(ALLOWED)
