"""Owns a one-service stack in its own process, for the janitor and port-race tests."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pytest_haico.errors import StackError
from pytest_haico.stack import Orchestrator, PortPool, PostgresService, Service, derive_base_port
from tests.stack.stack_helpers import tiny


def main() -> None:
    """Write `<out>/result-<id>.json` once started (or failed); hold the stack until stdin closes.

    With `--barrier`, write `<out>/ready-<id>` and wait for `<out>/go` first.
    """
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--state-dir", type=Path, required=True)
    parser.add_argument("--id", default="0")
    parser.add_argument("--job", default=None)
    parser.add_argument("--no-death-signal", action="store_true")
    parser.add_argument("--barrier", action="store_true")
    parser.add_argument("--cleanup", type=Path, action="append", default=[])
    parser.add_argument("--postgres", action="store_true", help="a PostgresService instead")
    args = parser.parse_args()
    env = {"SLURM_JOB_ID": args.job} if args.job else {}
    service: Service = tiny(
        f"web{args.id}",
        death_signal=None if args.no_death_signal else signal.SIGKILL,
        cleanup_paths=tuple(args.cleanup),
    )
    if args.postgres:
        service = PostgresService()
    orchestrator = Orchestrator(
        [service],
        args.out / f"logs-{args.id}",
        state_dir=args.state_dir,
        ports=PortPool(args.state_dir, env=env),
        reap=False,
    )
    if args.barrier:
        (args.out / f"ready-{args.id}").touch()
        deadline = time.monotonic() + 30
        while not (args.out / "go").exists() and time.monotonic() < deadline:
            time.sleep(0.001)
    result: dict[str, object] = {"owner": os.getpid()}
    try:
        orchestrator.start()
        process = orchestrator.processes[service.name]
        attempts = orchestrator.timings[service.name].attempts
        result.update(pid=process.pid, port=process.port, base=derive_base_port(env))
        result.update(attempts=attempts)
    except StackError as exc:
        result["error"] = str(exc)
    tmp = args.out / f".result-{args.id}.tmp"
    tmp.write_text(json.dumps(result))
    tmp.replace(args.out / f"result-{args.id}.json")
    sys.stdin.read()  # hold the stack until the test closes our stdin (or kills us)
    orchestrator.stop()


if __name__ == "__main__":
    main()
