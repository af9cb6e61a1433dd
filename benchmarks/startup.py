"""What a usage error of pytest-haico costs, over `pytest --version` (issue 23: 1 s or less).

Run: python benchmarks/startup.py [--repeats N]

Whole pytest processes in a fresh `haico init` repository, each refused at configure time
with exit code 4 and its one error line (checked):

* baseline: `pytest --version` (pytest answers it before loading any plugin);
* `--haico-arm nosuch` (the experiments read to know the arms);
* `--haico-concurrency 0` (refused as the options are resolved);
* an arm file with an unknown key (the experiments read and validated).

The cases run in turns, the order rotating, after one untimed warm-up each (bytecode cached
in a temporary PYTHONPYCACHEPREFIX, as on any machine after the first run); each figure is
the median of N runs, wall and CPU (user + system of the child), with the difference and
the ratio to the baseline measured in the same run, and the load average beside them.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BUDGET_S = 1.0  # over `pytest --version`, wall (issue 23)
BASELINE = "pytest --version"
# name -> (pytest's arguments, run in the copy with a bad arm file, a line the error prints)
CASES = {
    BASELINE: (["--version"], False, "pytest "),
    "--haico-arm nosuch": (["--haico-arm", "nosuch"], False, "no such arm"),
    "--haico-concurrency 0": (["--haico-concurrency", "0"], False, "--haico-concurrency"),
    "arm file with an unknown key": ([], True, "nosuchkey"),
}


def _timed(argv: list[str], cwd: Path, env: dict[str, str], expect: str) -> tuple[float, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, check=False, env=env)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    output = done.stdout + done.stderr
    if done.returncode not in (0, 4) or expect not in output:
        raise SystemExit(f"{' '.join(argv)} exited {done.returncode}:\n{output[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=11)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="haico-startup-bench-") as temp:
        repo, bad = Path(temp) / "repo", Path(temp) / "bad"
        subprocess.run(
            [sys.executable, "-m", "pytest_haico", "init", str(repo)],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        shutil.copytree(repo, bad)
        arm = next((bad / "experiments" / "arms").glob("*.toml"))
        arm.write_text(arm.read_text(encoding="utf-8") + "\nnosuchkey = 1\n", encoding="utf-8")
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env["PYTHONPYCACHEPREFIX"] = str(Path(temp) / "pycache")
        names = list(CASES)
        runs: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
        loads = [os.getloadavg()[0]]
        for repeat in range(-1, args.repeats):  # -1: the untimed warm-up
            for name in names[repeat % len(names) :] + names[: repeat % len(names)]:
                argv, in_bad, expect = CASES[name]
                cwd = bad if in_bad else repo
                timing = _timed([sys.executable, "-m", "pytest", *argv], cwd, env, expect)
                if repeat >= 0:
                    runs[name].append(timing)
        loads.append(os.getloadavg()[0])
    base_wall = statistics.median(w for w, _ in runs[BASELINE])
    base_cpu = statistics.median(c for _, c in runs[BASELINE])
    print(
        f"usage errors in a haico init repository, median of {args.repeats}, "
        f"load average {loads[0]:.2f} before, {loads[1]:.2f} after "
        f"({os.cpu_count()} CPUs); wall (CPU), over {BASELINE}:"
    )
    worst = 0.0
    for name in names:
        wall = statistics.median(w for w, _ in runs[name])
        cpu = statistics.median(c for _, c in runs[name])
        line = f"  {name:30s} {wall:6.3f} s ({cpu:5.3f} s CPU)"
        if name != BASELINE:
            worst = max(worst, wall - base_wall)
            line += (
                f"  +{wall - base_wall:.3f} s (+{cpu - base_cpu:.3f} s CPU)"
                f"  x{wall / base_wall:4.2f} (x{cpu / base_cpu:4.2f} CPU)"
            )
        print(line)
    verdict = "met" if worst <= BUDGET_S else "NOT met"
    print(f"budget {BUDGET_S:g} s over {BASELINE}: {verdict} (worst +{worst:.3f} s)")


if __name__ == "__main__":
    main()
