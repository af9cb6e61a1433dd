"""The `early` part of benchmarks/signals.py: a signal in a run's first seconds.

Each run is `pytest experiments` in a fresh `haico init` repository (in its own session,
with a private TMPDIR, without the hypothesis plugin, a test dependency of this repository
only); SIGTERM, SIGINT or SIGUSR1 goes to pytest at 0.3, 0.7, 1.5 and 3 s after its
start. Per signal and moment: the exit codes, the median seconds from the signal to the
exit, whether the output had a traceback, and what was left (a process of the run's
session, a directory the plugin makes in TMPDIR besides its state and template ones).
Budget: exit 75 (SIGINT in strict mode: pytest's 2) within 3 s, nothing left. A signal
that comes before Python has imported the plugin does what the process inherited (-15,
-10 or a KeyboardInterrupt traceback): the first figures show how long that window is.
"""

from __future__ import annotations

import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

MOMENTS_S = (0.3, 0.7, 1.5, 3.0)
SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)
BUDGET_S = 3.0
EXIT_TIMEOUT_S = 120.0
# The directories the plugin keeps in TMPDIR on purpose: its state and the Postgres template.
KEPT_PREFIXES = (f"pytest-haico-{os.getuid()}", "pytest-haico-templates-")


@dataclass
class EarlyResult:
    code: int
    exit_s: float
    traceback: bool
    left: list[str]


def _session_processes(sid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.getsid(int(entry)) == sid:
                    found.append(int(entry))
            except OSError:
                continue
    return found


def early_run(project: Path, signum: signal.Signals, at_s: float) -> EarlyResult:
    """One run of the project's campaign, signalled `at_s` seconds after its start."""
    shutil.rmtree(project / "results", ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix="haico-early-tmp-"))
    tmp.chmod(0o711)  # run as root, Postgres is user postgres: it must reach its directory
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PYTEST_HAICO_"))}
    env["TMPDIR"] = str(tmp)
    log = project / "pytest.log"
    command = [sys.executable, "-m", "pytest", "experiments", "-p", "no:hypothesispytest"]
    with open(log, "wb") as out:
        started = time.perf_counter()
        process = subprocess.Popen(
            command,
            cwd=project,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        time.sleep(max(0.0, at_s - (time.perf_counter() - started)))
        sent = time.perf_counter()
        process.send_signal(signum)
        try:
            code = process.wait(timeout=EXIT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            code = process.wait()
        ended = time.perf_counter()
    stray = _session_processes(process.pid)
    for pid in stray:
        os.kill(pid, signal.SIGKILL)
    dirs = [p.name for p in tmp.iterdir() if not p.name.startswith(KEPT_PREFIXES)]
    shutil.rmtree(tmp, ignore_errors=True)
    text = log.read_text(errors="replace")
    left = [f"pid {pid}" for pid in stray] + dirs
    return EarlyResult(code, ended - sent, "Traceback" in text or 'File "' in text, left)


def early(repeat: int) -> None:
    root = Path(tempfile.mkdtemp(prefix="haico-signals-early-"))
    try:
        subprocess.run(
            [sys.executable, "-m", "pytest_haico", "init", str(root / "project")],
            check=True,
            capture_output=True,
        )
        print(f"early: signal at a moment after pytest's start, median of {repeat}:")
        for signum in SIGNALS:
            for at_s in MOMENTS_S:
                results = [early_run(root / "project", signum, at_s) for _ in range(repeat)]
                _report(signum, at_s, results)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _report(signum: signal.Signals, at_s: float, results: list[EarlyResult]) -> None:
    expected = 2 if signum is signal.SIGINT else 75
    codes = Counter(r.code for r in results)
    median = statistics.median(r.exit_s for r in results)
    met = all(r.code == expected and r.exit_s <= BUDGET_S and not r.left for r in results)
    tracebacks = sum(r.traceback for r in results)
    left = sorted({item for r in results for item in r.left})
    print(
        f"  {signum.name:7} at {at_s:3.1f} s: exit {dict(codes)}, {median:.2f} s to exit "
        f"(max {max(r.exit_s for r in results):.2f}); exit {expected} within {BUDGET_S:g} s: "
        f"{'met' if met else 'NOT met'}"
        + (f"; {tracebacks} traceback(s)" if tracebacks else "")
        + (f"; left {left}" if left else "")
    )
