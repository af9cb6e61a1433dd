"""The package's parts import each other one way only (see `pytest_haico/__init__.py`), no
two modules import each other (not even for types only), and only `slurm/` runs Slurm's
commands."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import pytest_haico

PACKAGE = Path(pytest_haico.__file__).parent
# The bottom layer: helpers for the outside world every part shares (the redaction filter,
# files, /proc, durations as text, UTC stamps, percentiles, locks, HTTP clients). They
# import nothing of the package but `errors` and each other (`locks` checks its file as
# `files` does).
BOTTOM = {
    "redact",
    "files",
    "procfs",
    "durations",
    "stamps",
    "percentiles",
    "locks",
    "httpclient",
}
SHARED = {"pytest_haico", "pytest_haico.errors", *(f"pytest_haico.{name}" for name in BOTTOM)}

# part -> the parts it may import (besides itself and the shared helpers)
ALLOWED: dict[str, set[str]] = {
    "config": set(),
    "ledger": {"config"},
    "driver": {"config", "ledger.records", "ledger.times", "ledger.verdicts"},
    "stack": {"config"},
    "slurm": {"config"},
    # Gate gpu_check runs the cluster's GPU check (`site`).
    "gates": {"config", "ledger", "site", "slurm"},
    "provenance": {"config", "stack", "slurm", "ledger.layout"},
    "runner": {"config", "ledger", "driver", "stack", "provenance", "gates", "slurm", "serve"},
    "campaign": {"config", "ledger", "driver", "stack", "runner", "provenance", "gates", "slurm"},
    # The public results API (`pytest_haico.results`, a package): what the report, the
    # cost model and the command line read campaigns with. It reads the ledgers through
    # the ledger's format (neither imports pydantic: the report's start-up depends on it).
    "results": {"config", "ledger.format", "ledger.layout", "ledger.verdicts"},
    # It reads each run's timeline.json and model-metrics.csv through their owners.
    "report": {
        "config",
        "ledger.format",
        "ledger.layout",
        "ledger.verdicts",
        "ledger.timeline",
        "ledger.model_metrics",
        "results",
        "slurm",
    },
    # A submission sizes its arrays with the cost model.
    "submit": {"config", "ledger", "results", "report", "slurm"},
    "kept": {"config", "ledger", "stack", "provenance", "slurm"},
    # The cluster's house-keeping: the vLLM venv, the images' SIFs, the GPU check.
    "site": {"config", "slurm"},
    "serve": {"config", "ledger", "stack", "provenance", "slurm"},
    # Two runs of a backend developer's builds on one kept stack's model, compared.
    "validate": {"config", "ledger.layout", "results", "report", "stack", "kept"},
    "cli": {
        "config",
        "ledger",
        "results",
        "report",
        "submit",
        "kept",
        "serve",
        "site",
        "slurm",
        "validate",
    },
    "standins": set(),
}
# One concern per module: longer ones are split by concern (never into a `utils.py`).
MAX_MODULE_LINES = 400
SLURM_COMMANDS = {"sbatch", "squeue", "sacct", "scontrol", "sinfo", "scancel", "salloc", "srun"}
# The calls that start a process, by the dotted name they are imported under.
PROCESS_STARTERS = {
    "subprocess.run",
    "subprocess.Popen",
    "subprocess.call",
    "subprocess.check_call",
    "subprocess.check_output",
    "subprocess.getoutput",
    "subprocess.getstatusoutput",
    "os.system",
    "os.popen",
    "asyncio.create_subprocess_exec",
    "asyncio.create_subprocess_shell",
}
PROCESS_STARTER_PREFIXES = ("os.exec", "os.spawn", "os.posix_spawn")
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


@pytest.mark.parametrize("name", sorted(BOTTOM))
def test_the_bottom_layer_imports_nothing_of_the_package_but_errors_and_itself(
    name: str,
) -> None:
    path = PACKAGE / f"{name}.py"
    imported = {module for _, module in _imports(path)}
    allowed = {"pytest_haico.errors", *(f"pytest_haico.{other}" for other in BOTTOM - {name})}
    assert imported <= allowed, f"{path.relative_to(PACKAGE.parent)}: {imported}"


def test_every_module_is_at_most_400_lines() -> None:
    long = [
        f"{path.relative_to(PACKAGE.parent)}: {lines} lines"
        for module, path in _modules()
        if (lines := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    ]
    assert not long, "\n".join(long)


def _module_level_imports(module: str, tree: ast.Module, modules: set[str]) -> set[str]:
    """The `modules` that `tree` imports when it is imported or type-checked: its
    module-level imports, those under `if TYPE_CHECKING:` included; not those inside a
    function (a deliberate lazy import), nor the root package (every module's parent)."""
    found: set[str] = set()
    nodes: list[ast.stmt] = list(tree.body)
    while nodes:
        node = nodes.pop()
        if isinstance(node, ast.If | ast.Try):
            nodes += [*node.body, *node.orelse, *getattr(node, "finalbody", [])]
            nodes += [stmt for handler in getattr(node, "handlers", []) for stmt in handler.body]
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                name = f"{node.module}.{alias.name}"
                found.add(name if name in modules else node.module)
    return {name for name in found if name in modules and name not in ("pytest_haico", module)}


def _import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for imported in sorted(graph.get(module, ())):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            component = [stack.pop()]
            while component[-1] != module:
                component.append(stack.pop())
            if len(component) > 1:
                cycles.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return cycles


def test_no_modules_import_each_other_not_even_for_types_only() -> None:
    """A type one module needs from another that imports it lives with its owner instead."""
    modules = {module for module, _ in _modules()}
    graph = {
        module: _module_level_imports(module, ast.parse(path.read_text(), str(path)), modules)
        for module, path in _modules()
    }
    cycles = _import_cycles(graph)
    assert not cycles, "\n".join(" <-> ".join(cycle) for cycle in cycles)


def test_the_cycle_rule_catches_a_type_only_cycle() -> None:
    errors = ast.parse(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from pytest_haico.gates.result import GateResult\n"
        "def lazy():\n"
        "    from pytest_haico.files import write_atomic\n"
    )
    modules = {"pytest_haico.errors", "pytest_haico.files", "pytest_haico.gates.result"}
    imported = _module_level_imports("pytest_haico.errors", errors, modules)
    assert imported == {"pytest_haico.gates.result"}
    graph = {"pytest_haico.errors": imported, "pytest_haico.gates.result": {"pytest_haico.errors"}}
    assert _import_cycles(graph) == [["pytest_haico.errors", "pytest_haico.gates.result"]]


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
    assert _is_allowed("pytest_haico.standins.llm", "pytest_haico.durations")
    assert _is_allowed("pytest_haico.ledger.jsonl", "pytest_haico.files")


def _documented_table() -> dict[str, set[str]]:
    """The import table of docs/how-it-works.md: part -> the parts it may import."""
    text = (PACKAGE.parent / "docs" / "how-it-works.md").read_text()
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


def test_the_documented_import_table_is_the_rule() -> None:
    assert _documented_table() == ALLOWED


def test_every_part_is_a_folder_of_the_package() -> None:
    folders = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    assert folders == set(ALLOWED)


def _names_a_slurm_command(text: str) -> bool:
    """A program (``squeue``, ``/usr/bin/squeue``) or a shell line whose first word is one."""
    words = text.split()
    return bool(words) and words[0].rsplit("/", 1)[-1] in SLURM_COMMANDS


def _scope_nodes(scope: ast.AST) -> list[ast.AST]:
    """The nodes of a module's or a function's own body, not of the functions in it."""
    nodes: list[ast.AST] = []
    pending = list(ast.iter_child_nodes(scope))
    while pending:
        node = pending.pop()
        nodes.append(node)
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            pending.extend(ast.iter_child_nodes(node))
    return nodes


def _slurm_command_runs(source: str) -> list[int]:
    """The lines of calls that start a process naming a Slurm command: in their arguments,
    or in what a name among them was assigned in the same function (``argv = ["squeue",
    ...]``, ``scontrol = shutil.which("scontrol")``); and, in a module that starts
    processes, of each Slurm command line (``["squeue", ...]``), which may reach them
    through a parameter.
    """
    tree = ast.parse(source)
    imported: dict[str, str] = {}  # local name -> the dotted name it stands for
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                top = alias.name.split(".")[0]
                imported[alias.asname or top] = alias.name if alias.asname else top
        elif isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                imported[alias.asname or alias.name] = f"{node.module}.{alias.name}"

    def dotted(node: ast.expr) -> str:
        if isinstance(node, ast.Name):
            return imported.get(node.id, node.id)
        if isinstance(node, ast.Attribute):
            return f"{dotted(node.value)}.{node.attr}"
        return ""

    def names_slurm(node: ast.AST, assigned: dict[str, list[ast.expr]], seen: set[str]) -> bool:
        if isinstance(node, ast.Constant):
            return isinstance(node.value, str) and _names_a_slurm_command(node.value)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            return False  # a path: `project / "sbatch"` is the project's folder
        if isinstance(node, ast.Name):
            if node.id in seen:
                return False
            values = assigned.get(node.id, [])
            return any(names_slurm(value, assigned, seen | {node.id}) for value in values)
        return any(names_slurm(child, assigned, seen) for child in ast.iter_child_nodes(node))

    runs: set[int] = set()
    command_lines: set[int] = set()
    starts_processes = False
    scopes = [
        tree,
        *(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)),
    ]
    for scope in scopes:
        nodes = _scope_nodes(scope)
        assigned: dict[str, list[ast.expr]] = {}
        for node in nodes:
            if isinstance(node, ast.Assign | ast.AnnAssign | ast.NamedExpr) and node.value:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    if isinstance(target, ast.Name):
                        assigned.setdefault(target.id, []).append(node.value)
        for node in nodes:
            if isinstance(node, ast.List | ast.Tuple) and node.elts:
                first = node.elts[0]
                if isinstance(first, ast.Constant) and _names_a_slurm_command(str(first.value)):
                    command_lines.add(node.lineno)
            if not isinstance(node, ast.Call):
                continue
            called = dotted(node.func)
            if called in PROCESS_STARTERS or called.startswith(PROCESS_STARTER_PREFIXES):
                starts_processes = True
                arguments = [*node.args, *(keyword.value for keyword in node.keywords)]
                if any(names_slurm(argument, assigned, set()) for argument in arguments):
                    runs.add(node.lineno)
    return sorted(runs | command_lines if starts_processes else runs)


def test_only_the_slurm_part_runs_slurm_commands() -> None:
    runs = [
        f"{path.relative_to(PACKAGE.parent)}:{line}: runs a Slurm command outside slurm/"
        for module, path in _modules()
        if _part(module) != "slurm"
        for line in _slurm_command_runs(path.read_text())
    ]
    assert not runs, "\n".join(runs)


def test_the_slurm_rule_catches_a_slurm_command_run_elsewhere() -> None:
    planted = """
import asyncio, os, shutil, subprocess
import subprocess as sp
from subprocess import check_output as out

def direct(job):
    return subprocess.run(["scontrol", "-o", "show", "job", job], check=False)
def found_first():
    scontrol = shutil.which("scontrol")
    sp.run([scontrol, "show", "hostnames", "n[1-2]"])
def built_before():
    argv = ["/usr/bin/squeue", "-h"]
    return out(list(argv))
def replaced():
    os.execvp("sbatch", ["sbatch", "job.sh"])
async def awaited():
    await asyncio.create_subprocess_exec("sinfo", "-h")
def shell():
    subprocess.Popen("srun --pty bash", shell=True)
def generic(argv):
    return subprocess.run(argv, capture_output=True)
def through_a_parameter():
    return generic(["sacct", "-X"])
def not_slurm(project):
    subprocess.run(["cp", str(project / "sbatch" / "campaign.sbatch"), "/tmp"])
    subprocess.run(["pg_dump", "--file", "sbatch.sql"])
"""
    assert _slurm_command_runs(planted) == [7, 10, 12, 13, 15, 17, 19, 23]
    # A command line built for `slurm/` to run, in a module that starts no process.
    assert _slurm_command_runs('argv = ["sbatch", "--parsable"]\nsubmit(argv)\n') == []


# httpx's calls that make a client (and load the CA bundle); `httpclient` owns them.
HTTPX_CLIENT_MAKERS = {"Client", "AsyncClient", "get", "post", "put", "delete", "request", "stream"}


def _httpx_client_lines(source: str) -> list[int]:
    """The lines that call one of `HTTPX_CLIENT_MAKERS` as ``httpx.<name>`` or import one."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module == "httpx":
            if any(alias.name in HTTPX_CLIENT_MAKERS for alias in node.names):
                lines.append(node.lineno)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "httpx"
            and node.func.attr in HTTPX_CLIENT_MAKERS
        ):
            lines.append(node.lineno)
    return sorted(lines)


def test_only_httpclient_makes_the_harness_http_clients() -> None:
    """The stand-ins, separate processes, make their own (one each)."""
    made = [
        f"{path.relative_to(PACKAGE.parent)}:{line}: an httpx client outside httpclient.py"
        for module, path in _modules()
        if module != "pytest_haico.httpclient" and _part(module) != "standins"
        for line in _httpx_client_lines(path.read_text())
    ]
    assert not made, "\n".join(made)
    planted = "import httpx\nhttpx.get(url)\nhttpx.AsyncClient()\nfrom httpx import Client\n"
    assert _httpx_client_lines(planted) == [2, 3, 4]
    assert _httpx_client_lines("import httpx\nfrom httpx import HTTPError\n") == []
