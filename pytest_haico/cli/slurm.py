"""Slurm's client commands, run with an allow-listed environment.

An `salloc` shell exports SLURM_MEM_PER_CPU, SLURM_CPU_BIND, CUDA_VISIBLE_DEVICES and the
user's OPENAI_* tokens; inherited by `sbatch` they would silently change the new job, or
travel with it. Every command here gets only `ALLOWED_ENV` of the caller's environment.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence

from pytest_haico.errors import HaicoError

# DESIGN: what sbatch (and so the job, with --export=ALL) may see of the submitting shell.
ALLOWED_ENV = ("HOME", "USER", "LOGNAME", "SHELL", "PATH", "LANG", "TZ", "TMPDIR", "SLURM_CONF")
ALLOWED_PREFIXES = ("LC_",)

_TIMEOUT_S = 120.0


class SlurmError(HaicoError):
    """A Slurm client command is missing, failed or did not answer."""


def allowed_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The allow-listed part of `environ` (default: this process's)."""
    source = os.environ if environ is None else environ
    return {
        name: value
        for name, value in source.items()
        if name in ALLOWED_ENV or name.startswith(ALLOWED_PREFIXES)
    }


def run(
    argv: Sequence[str],
    *,
    environ: Mapping[str, str] | None = None,
    check: bool = True,
    timeout: float = _TIMEOUT_S,
) -> subprocess.CompletedProcess[str]:
    """Run a Slurm client command with the allow-listed environment and return what it did.

    A command not on PATH, one that does not answer within `timeout`, or (with `check`)
    one that fails is a `SlurmError` saying which and what it printed.
    """
    env = allowed_environment(environ)
    program = shutil.which(argv[0], path=env.get("PATH"))
    if program is None:
        raise SlurmError(
            f"{argv[0]} is not on PATH: run haico where Slurm's client commands are "
            "(a login node of the cluster), or add them to PATH"
        )
    try:
        done = subprocess.run(
            [program, *argv[1:]],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as exc:
        raise SlurmError(
            f"{argv[0]} did not answer within {timeout:.0f} s: is slurmctld reachable? "
            "(try `scontrol ping`)"
        ) from exc
    except OSError as exc:
        raise SlurmError(f"{argv[0]} could not be run: {exc.strerror or exc}") from exc
    if check and done.returncode != 0:
        said = (done.stderr or done.stdout).strip().splitlines()
        raise SlurmError(
            f"`{' '.join(argv[:2])} ...` failed (exit {done.returncode})"
            + (f": {said[-1]}" if said else "")
        )
    return done
