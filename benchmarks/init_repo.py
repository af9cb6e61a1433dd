"""What a repository made by `haico init` costs to start, over `pytest --version`.

Run: python benchmarks/init_repo.py [--repeats N]

Whole pytest processes in a fresh `haico init` repository (its pytest.ini turns off the
plugins that only cost start-up time and sets pytest-asyncio's loop scope):

* baseline: `pytest --version` (pytest answers it before loading any plugin);
* start-up: `pytest --collect-only -q` (every plugin, pytest-haico's configure, the
  experiments read, the items collected and selected; no stack);
* the same without the repository's pytest.ini, as a copy of the demo experiments
  without an ini file starts;
* the whole campaign: `pytest` (its two items, the local stack included).

Each figure is the median of N runs, every command in turn (the order rotating), CPU time
(user + system of the child) beside it; ratios are against the baseline of the same run.
"""

from __future__ import annotations

import argparse
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# name -> (pytest's arguments, run in the copy without pytest.ini)
CASES = {
    "pytest --version": (["--version"], False),
    "start-up (--collect-only)": (["--collect-only", "-q"], False),
    "start-up without pytest.ini": (["--collect-only", "-q", "experiments"], True),
    "the whole campaign (2 items)": (["-q"], False),
}


def _timed(argv: list[str], cwd: Path) -> tuple[float, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {done.returncode}:\n{done.stdout[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="haico-init-bench-") as temp:
        repo, bare = Path(temp) / "repo", Path(temp) / "bare"
        subprocess.run(
            [sys.executable, "-m", "pytest_haico", "init", str(repo)],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        shutil.copytree(repo, bare)
        (bare / "pytest.ini").unlink()
        names = list(CASES)
        runs: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
        for repeat in range(args.repeats):
            for name in names[repeat % len(names) :] + names[: repeat % len(names)]:
                argv, without_ini = CASES[name]
                cwd = bare if without_ini else repo
                shutil.rmtree(cwd / "results", ignore_errors=True)  # every run does it all
                runs[name].append(_timed([sys.executable, "-m", "pytest", *argv], cwd))
    baseline = statistics.median(wall for wall, _ in runs[names[0]])
    print(f"haico init repository, median of {args.repeats} (wall, CPU; ratio to baseline):")
    for name in names:
        wall = statistics.median(w for w, _ in runs[name])
        cpu = statistics.median(c for _, c in runs[name])
        extra = wall - baseline
        print(
            f"  {name:32s} {wall:6.3f} s ({cpu:5.3f} s CPU)  x{wall / baseline:5.2f}  "
            f"+{extra:.3f} s"
        )


if __name__ == "__main__":
    main()
