"""`haico env`'s job (templates/env.sbatch runs `python -m pytest_haico.site.job PLAN`): build
the venv the plan names unless it is built, then pull the images. Exit 0 when all is there,
1 when a step failed (its line says which; the step's own output is above it)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

from pytest_haico.errors import HaicoError
from pytest_haico.files import PRIVATE_FILE_MODE
from pytest_haico.site.images import pull_images
from pytest_haico.site.plan import VenvBuild, read_plan
from pytest_haico.site.venv import build_venv, is_built


@contextlib.contextmanager
def _building(venv: Path) -> Iterator[None]:
    """One build of `venv` at a time: a lock file beside it (a second job waits, then finds
    the venv built)."""
    venv.parent.mkdir(parents=True, exist_ok=True)
    lock = venv.parent / f".{venv.name}.haico-env.lock"
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, PRIVATE_FILE_MODE)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _ensure_venv(build: VenvBuild) -> None:
    with _building(build.venv):
        marker = is_built(build.venv, build.sha256)
        if marker is not None:
            print(f"haico env: {build.venv} is already built: {marker.describe()}", flush=True)
            return
        build_venv(
            build.venv,
            build.requirements,
            digest=build.sha256,
            job_id=os.environ.get("SLURM_JOB_ID"),
            say=lambda line: print(line, flush=True),
        )


def main(argv: Sequence[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m pytest_haico.site.job PLAN", file=sys.stderr)
        return 2
    try:
        plan = read_plan(Path(argv[0]))
        if plan.venv is not None:
            _ensure_venv(plan.venv)
        pull_images(
            plan.pulls,
            token_file=plan.token_file,
            user=plan.registry_user,
            environ=os.environ,
            say=lambda line: print(line, flush=True),
        )
    except HaicoError as exc:
        print(f"haico env: {exc}", file=sys.stderr, flush=True)
        return 1
    print("haico env: done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
