"""What a campaign that fails before anything starts costs over `pytest --version`.

Run: python benchmarks/static_gate.py [--repeats N] [--bytecode env|cached|both]

Whole pytest processes, in a campaign project as a user writes it (experiments/ with an
arm, a script and a test module; no ini file, so nothing turns a plugin off), the way
sbatch/campaign.sbatch runs them (`--haico-exit campaign -p no:cacheprovider`):

* baseline: `pytest --version` (pytest answers it before loading any plugin);
* a bad arm file: an unknown key, refused at configure time (exit 4);
* a static gate: OPENAI_ENDPOINT_URL set, so prohibited_environment fails when the arm's
  stack would start, at the first item (exit 78, gates.json written);
* for scale, the bad arm file with langsmith's pytest plugin loaded on purpose (`-p
  langsmith_plugin`): what pytest-haico holding it back saves a campaign; and, where
  hypothesis is installed (a test dependency of this repository, not of a campaign's
  environment), the gate without its plugin, whose terminal summary imports hypothesis.

Target: a static gate failure costs at most 1 s over the baseline. Each figure is the
median of N runs, every command in turn (the order rotating), so a drift in a shared
machine's load moves all of them; CPU time (user + system) is shown beside it. Two
bytecode regimes: this environment's own (where PYTHONDONTWRITEBYTECODE is set, pytest
compiles and assert-rewrites every module of an entry-point plugin at every start), and
cached (a temporary PYTHONPYCACHEPREFIX, one untimed run of each command first), as on
any machine after the first run. Figures past the target are reported, never asserted:
the exit status is 0 unless a run ended with an unexpected status.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

TARGET_S = 1.0
BAD_ARM = '[modle]\nserved_name = "demo"\n'  # a typo of [model]
TEST_MODULE = """
from pytest_haico import Verdict


def test_conversation(haico_conversation):
    assert haico_conversation.verdict is Verdict.COMPLETED, haico_conversation.explain()
"""
GATE_ENV = {"OPENAI_ENDPOINT_URL": "https://api.openai.com/v1"}
CAMPAIGN = ["experiments", "--haico-exit", "campaign", "-p", "no:cacheprovider"]


class BenchmarkError(Exception):
    """A run that could not be measured: it ended with another status than its case's."""


@dataclass(frozen=True)
class Case:
    label: str
    args: list[str]
    project: str  # the directory it runs in, under the benchmark's temporary directory
    status: int
    env: dict[str, str]


def write_project(root: Path, arm: str) -> None:
    experiments = root / "experiments"
    (experiments / "arms").mkdir(parents=True)
    (experiments / "scripts").mkdir()
    (experiments / "arms" / "demo.toml").write_text(arm)
    script = {"id": "greet", "turns": [{"user": "Hello."}]}
    (experiments / "scripts" / "greet.jsonl").write_text(json.dumps(script) + "\n")
    (experiments / "test_conversations.py").write_text(TEST_MODULE)


def has_plugin(name: str) -> bool:
    return bool(importlib.metadata.entry_points(group="pytest11", name=name))


def cases() -> list[Case]:
    found = [
        Case("pytest --version (baseline)", ["--version"], "bad-arm", 0, {}),
        Case("bad arm file (exit 4)", CAMPAIGN, "bad-arm", 4, {}),
        Case("static gate prohibited_environment (exit 78)", CAMPAIGN, "gate", 78, GATE_ENV),
    ]
    if has_plugin("langsmith_plugin"):
        forced = [*CAMPAIGN, "-p", "langsmith_plugin"]
        found.append(Case("  bad arm file, -p langsmith_plugin", forced, "bad-arm", 4, {}))
    if has_plugin("hypothesispytest"):
        without = [*CAMPAIGN, "-p", "no:hypothesispytest"]
        found.append(Case("  static gate, -p no:hypothesispytest", without, "gate", 78, GATE_ENV))
    return found


def base_env() -> dict[str, str]:
    """This environment without what would change the runs: a Slurm job's variables, haico
    settings, pytest's own switches, and the variable the gate case sets."""
    dropped = {"CLUSTER_WORK", "PYTEST_ADDOPTS", "PYTEST_PLUGINS"}
    dropped |= {"PYTEST_DISABLE_PLUGIN_AUTOLOAD", *GATE_ENV}
    return {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SLURM_", "PYTEST_HAICO_")) and k not in dropped
    }


def run(case: Case, base: Path, env: dict[str, str]) -> tuple[float, float, str]:
    """One run of `case`: its wall time, its CPU time, its output."""
    cwd = base / case.project
    shutil.rmtree(cwd / "results", ignore_errors=True)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", *case.args],
        cwd=cwd,
        env={**env, **case.env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        check=False,
    )
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if done.returncode != case.status:
        raise BenchmarkError(
            f"{case.label}: exit {done.returncode}, expected {case.status}:\n{done.stdout[-2000:]}"
        )
    return wall, cpu, done.stdout


def measure(regime: str, base: Path, repeats: int) -> None:
    env = base_env()
    if regime == "cached":
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(base / "pycache")
        title = "bytecode cached (a temporary PYTHONPYCACHEPREFIX)"
    else:
        written = "not written" if env.get("PYTHONDONTWRITEBYTECODE") else "written"
        title = f"bytecode as this environment has it ({written})"
    all_cases = cases()
    walls: dict[str, list[float]] = {case.label: [] for case in all_cases}
    cpus: dict[str, list[float]] = {case.label: [] for case in all_cases}
    headers = {}
    for case in all_cases:  # untimed: bytecode and rewritten asserts land in the cache
        headers[case.label] = run(case, base, env)[2]
    for repeat in range(repeats):
        shift = repeat % len(all_cases)
        for case in all_cases[shift:] + all_cases[:shift]:
            wall, cpu, _ = run(case, base, env)
            walls[case.label].append(wall)
            cpus[case.label].append(cpu)
    print(f"{title}, medians of {repeats}:")
    baseline = statistics.median(walls[all_cases[0].label])
    for case in all_cases:
        wall = statistics.median(walls[case.label])
        cpu = statistics.median(cpus[case.label])
        line = f"  {case.label:46} {wall:6.3f} s  cpu {cpu:5.3f} s"
        if case is not all_cases[0]:
            extra = wall - baseline
            verdict = "within" if extra <= TARGET_S else "OVER"
            line += f"  +{extra:.3f} s  x{wall / baseline:.1f}"
            if not case.label.startswith(" "):
                line += f"  ({verdict} the {TARGET_S:.0f} s target)"
        print(line + f"  {_all(walls[case.label])}")
    gate = headers[all_cases[2].label]
    plugins = next((line for line in gate.splitlines() if line.startswith("plugins:")), "")
    loaded = "yes" if "langsmith" in plugins else "no"
    print(f"  langsmith's pytest plugin loaded in the campaign: {loaded}")


def _all(figures: list[float]) -> str:
    return "[" + ", ".join(f"{f:.2f}" for f in figures) + "]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="runs of each command")
    parser.add_argument("--bytecode", choices=("env", "cached", "both"), default="both")
    args = parser.parse_args()
    regimes = ["env", "cached"] if args.bytecode == "both" else [args.bytecode]
    began = time.perf_counter()
    failed = False
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        write_project(base / "bad-arm", BAD_ARM)
        write_project(base / "gate", "")
        for regime in regimes:
            before = os.getloadavg()[0]
            try:
                measure(regime, base, args.repeats)
            except BenchmarkError as exc:
                print(f"{regime}: could not be measured: {exc}")
                failed = True
            # The figures mean little when other work held the cores.
            print(
                f"  load average {before:.1f} before, {os.getloadavg()[0]:.1f} after "
                f"({os.cpu_count()} cores)"
            )
    print(f"({time.perf_counter() - began:.0f} s in all)")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
