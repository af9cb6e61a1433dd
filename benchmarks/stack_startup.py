"""Benchmark: time from pytest start to the local stack being healthy, and each service's share.

Run: python benchmarks/stack_startup.py [--repeats N]

A tiny project (one default arm, one script) gets two one-test modules: one
requests `haico_stack` and writes the wall clock the moment it runs, the stack's
per-service timings, and from the run's timeline.json when every service was
healthy and when the dynamic gates had passed (the test runs once provenance has
also asked the model server what it is); the baseline test requests nothing and
writes the wall clock as soon as it runs (plain pytest start-up with the plugin
and the campaign loaded). Each is measured from just before its pytest
subprocess starts; the two alternate, so a noisy shared machine moves both.
Target: start -> stack healthy (every service) <= 3 s.

Per service: when its launch began and when it was healthy, both from the stack's
start; its prepare (Postgres' template copy, in a worker thread, overlapping the
others); spawn -> healthy. The services start in parallel where the stack allows
(the stand-in backend is spawned alongside Postgres and waits for it), so the one
healthy last sets the stack's own start.

Bytecode is cached (in a temporary PYTHONPYCACHEPREFIX, one untimed warm-up
run of each module first), as on any machine after the first run; the
warm-up also builds the Postgres template if it is missing. --no-pycache sets
PYTHONDONTWRITEBYTECODE=1 instead: every import, and every assertion rewrite of
a pytest plugin, is then compiled from source at each start. The project's
addopts disable LangSmith's pytest plugin, as this repository's pyproject.toml
does; --with-langsmith keeps it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

TARGET_S = 3.0
SERVICES = ("postgres", "llm", "backend")

STACK_TEST = """
import json
import time

from pytest_haico.runner.arm_runs import ARM_RUNS_KEY

OUT = {out!r}


def test_stack(request, haico_stack):
    healthy = time.time()
    timings = getattr(haico_stack, "timings", None)
    if timings is None:  # not on the HaicoStack view: read the arm session's stack
        sessions = request.config.stash[ARM_RUNS_KEY]
        timings = sessions._sessions[haico_stack.arm].stack.timings
    phases = ("prepare", "healthy", "launched", "ready")
    services = {{
        name: {{phase: getattr(t, phase, None) for phase in phases}}
        for name, t in timings.items()
    }}
    # This run's timeline (the newest): when its stack was healthy and its gates passed.
    timelines = request.config.rootpath.glob("results/**/timeline.json")
    phases = json.loads(max(timelines, key=lambda path: path.stat().st_mtime).read_text())
    ends = {{name: phases["phases"][name]["end"] for name in ("stack", "dynamic_gates")}}
    with open(OUT, "w") as handle:
        json.dump({{"at": healthy, "services": services, "ends": ends}}, handle)
"""

BASELINE_TEST = """
import json
import time

OUT = {out!r}


def test_baseline():
    with open(OUT, "w") as handle:
        json.dump({{"at": time.time()}}, handle)
"""

ARM = (
    "# Every other setting at its default: the local profile's stand-ins, persona helpful.\n"
    'description = "stack start-up benchmark"\n'
)
SCRIPT = "id: a\nturns:\n  - user: Hello, who are you?\n"


def write_project(root: Path, *, langsmith: bool) -> None:
    """The tiny pytest project: pyproject.toml, one arm, one script, the two test modules."""
    experiments = root / "experiments"
    (experiments / "arms").mkdir(parents=True)
    (experiments / "scripts").mkdir()
    addopts = "" if langsmith else 'addopts = ["-p", "no:langsmith_plugin"]\n'
    (root / "pyproject.toml").write_text(
        '[tool.pytest.ini_options]\nasyncio_default_fixture_loop_scope = "function"\n' + addopts
    )
    (experiments / "arms" / "demo.toml").write_text(ARM)
    (experiments / "scripts" / "a.yaml").write_text(SCRIPT)
    out = str(root / "out.json")
    (experiments / "test_stack.py").write_text(STACK_TEST.format(out=out))
    (experiments / "test_baseline.py").write_text(BASELINE_TEST.format(out=out))


def pytest_env(root: Path, *, pycache: bool) -> dict[str, str]:
    """This environment with bytecode caching switched on (in a prefix under `root`) or off."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX")
    }
    if pycache:
        env["PYTHONPYCACHEPREFIX"] = str(root / "pycache")
    else:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def run_pytest(root: Path, module: str, env: dict[str, str]) -> tuple[float, float, dict[str, Any]]:
    """(start -> the test's stamp, start -> exit, the test's JSON), in seconds."""
    out = root / "out.json"
    out.unlink(missing_ok=True)
    command = [sys.executable, "-m", "pytest", f"experiments/{module}", "-p", "no:cacheprovider"]
    wall_start = time.time()
    began = time.perf_counter()
    result = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - began
    if result.returncode != 0 or not out.is_file():
        output = result.stdout[-3000:] + result.stderr[-2000:]
        sys.exit(f"{' '.join(command)} failed ({result.returncode}):\n{output}")
    data: dict[str, Any] = json.loads(out.read_text())
    return data["at"] - wall_start, elapsed, data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="runs of each (default 5)")
    parser.add_argument(
        "--no-pycache", action="store_true", help="compile every import from source at each start"
    )
    parser.add_argument(
        "--with-langsmith", action="store_true", help="keep LangSmith's pytest plugin loaded"
    )
    args = parser.parse_args()
    healthy: list[float] = []  # every service healthy
    gated: list[float] = []  # and the dynamic gates passed
    first_test: list[float] = []  # and the run's provenance written: the test runs
    baseline: list[float] = []
    stack_exit: list[float] = []
    baseline_exit: list[float] = []
    shares: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="haico-startup-") as tmp:
        root = Path(tmp)
        write_project(root, langsmith=args.with_langsmith)
        env = pytest_env(root, pycache=not args.no_pycache)
        if not args.no_pycache:
            for module in ("test_baseline.py", "test_stack.py"):
                run_pytest(root, module, env)
        for _ in range(args.repeats):
            at, elapsed, _data = run_pytest(root, "test_baseline.py", env)
            baseline.append(at)
            baseline_exit.append(elapsed)
            at, elapsed, data = run_pytest(root, "test_stack.py", env)
            began = data["at"] - at
            healthy.append(data["ends"]["stack"] - began)
            gated.append(data["ends"]["dynamic_gates"] - began)
            first_test.append(at)
            stack_exit.append(elapsed)
            for name, timing in data["services"].items():
                for phase, seconds in timing.items():
                    if seconds is not None:  # older stacks had no launch and ready offsets
                        shares.setdefault((name, phase), []).append(seconds)

    def med(values: list[float]) -> float:
        return statistics.median(values)

    start, base = med(first_test), med(baseline)
    pycache = "off" if args.no_pycache else "warm"
    langsmith = "on" if args.with_langsmith else "off"
    print(
        f"medians of {args.repeats} runs each "
        f"(bytecode cache {pycache}, LangSmith's pytest plugin {langsmith})"
    )
    print(
        f"  pytest start -> stack healthy     {med(healthy):6.2f} s   (every service; "
        f"target <= {TARGET_S:g} s)"
    )
    print(f"               -> gates passed      {med(gated):6.2f} s")
    print(f"               -> the test runs     {start:6.2f} s   (provenance written)")
    print(f"  pytest start -> baseline test     {base:6.2f} s")
    print(f"  difference (the test's start)     {start - base:6.2f} s")
    print(f"  ratio against the baseline        {start / base:6.2f}x")
    print(
        f"  whole process, stack / baseline   {med(stack_exit):6.2f} s / {med(baseline_exit):.2f} s"
    )

    def column(name: str, phase: str) -> str:
        values = shares.get((name, phase))
        return f"{med(values):6.2f}" if values else "     -"

    print("  per service (s)            launched  prepare  spawn -> healthy  healthy at")
    labels = {"postgres": "postgres (template copy)", "llm": "llm", "backend": "backend"}
    for name in SERVICES:
        cells = [column(name, phase) for phase in ("launched", "prepare", "healthy", "ready")]
        print(f"    {labels[name]:<24} {cells[0]}   {cells[1]}      {cells[2]}       {cells[3]}")
    if all((name, "ready") in shares for name in SERVICES):
        last = max(SERVICES, key=lambda name: med(shares[(name, "ready")]))
        ready = med(shares[(last, "ready")])
        print(f"  healthy last: {last}, {ready:.2f} s after the stack's start")


if __name__ == "__main__":
    main()
