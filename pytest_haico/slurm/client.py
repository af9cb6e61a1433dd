"""How a Slurm client command runs: the environment it gets, how long it may take, what it
answered.

An `salloc` shell exports SLURM_MEM_PER_CPU, SLURM_CPU_BIND, CUDA_VISIBLE_DEVICES and the
user's OPENAI_* tokens; inherited by `sbatch` they would silently change the new job, or
travel with it. Every command gets only `ALLOWED_ENV` of the caller's environment, inside a
job too (slurmd sets SLURM_CONF there, and PATH finds the commands). SLURM_TIME_FORMAT is
not allowed either, so Slurm prints its standard timestamps, the ones the parsers read.

SlurmError
├── NotRun             the command could not be started: it did nothing
├── NoAnswer           it did not answer within its timeout
├── CommandFailed      it exited non-zero
└── SubmissionRefused  sbatch said the job was not submitted (in `jobs`)
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from pytest_haico.errors import HaicoError

# DESIGN: what sbatch (and so the job, with --export=ALL) may see of the submitting shell.
ALLOWED_ENV = ("HOME", "USER", "LOGNAME", "SHELL", "PATH", "LANG", "TZ", "TMPDIR", "SLURM_CONF")
ALLOWED_PREFIXES = ("LC_",)

# Queries from inside a job (a run's end time, its nodes, the Slurm version; whether a kept
# stack's allocation ended) must never hold it up: each caller has an answer without Slurm.
IN_JOB_TIMEOUT_S = 10.0
# haico's campaign operations on the login node (sbatch, the journal's reconciliation,
# sinfo): a controller busy with a large array can take tens of seconds, and an sbatch
# given up on too early leaves its job's submission in doubt.
OPERATION_TIMEOUT_S = 120.0
# How much of a line a command printed goes into a message.
_SAID_CHARS = 200


class SlurmError(HaicoError):
    """A Slurm client command is missing, failed or did not answer."""


class NotRun(SlurmError):
    """The command could not be started (not on PATH, not executable): it did nothing.

    `brief` says so in a few words, for a message that lists several attempts."""

    def __init__(self, message: str, *, brief: str) -> None:
        super().__init__(message)
        self.brief = brief

    @classmethod
    def missing(cls, program: str) -> NotRun:
        return cls(
            f"{program} is not on PATH: run haico where Slurm's client commands are "
            "(a login node of the cluster), or add them to PATH",
            brief=f"{program} not found",
        )

    @classmethod
    def refused(cls, program: str, error: OSError) -> NotRun:
        return cls(
            f"{program} could not be run: {error.strerror or error}",
            brief=f"cannot start it: [Errno {error.errno}] {error.strerror}",
        )


class NoAnswer(SlurmError):
    """The command did not answer within its timeout (it was killed)."""

    def __init__(self, program: str, timeout_s: float) -> None:
        super().__init__(
            f"{program} did not answer within {timeout_s:.0f} s: is slurmctld reachable? "
            "(try `scontrol ping`)"
        )
        self.brief = f"no answer within {timeout_s:g} s"


class CommandFailed(SlurmError):
    """The command exited non-zero."""


@dataclass(frozen=True)
class Answer:
    """What a command that ran printed, and its exit status."""

    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str = ""

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    @property
    def said(self) -> str:
        """The last line it printed, on stderr if it printed there; "" for nothing."""
        lines = (self.stderr.strip() or self.stdout.strip()).splitlines()
        return lines[-1][:_SAID_CHARS] if lines else ""

    @property
    def first_line(self) -> str:
        """The first line it printed on stdout; "" for nothing."""
        lines = self.stdout.strip().splitlines()
        return lines[0][:_SAID_CHARS] if lines else ""

    def checked(self) -> Answer:
        """This answer; `CommandFailed` saying what the command said when it failed."""
        if not self.ok:
            raise CommandFailed(
                f"`{' '.join(self.argv[:2])} ...` failed (exit {self.returncode})"
                + (f": {self.said}" if self.said else "")
            )
        return self


class Run(Protocol):
    """Runs a Slurm client command: `run`, or a stand-in for it in a test."""

    def __call__(
        self, argv: Sequence[str], *, environ: Mapping[str, str] | None, timeout_s: float
    ) -> Answer: ...


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
    timeout_s: float = OPERATION_TIMEOUT_S,
) -> Answer:
    """Run a Slurm client command (an argv, never a shell) with the allow-listed part of
    `environ` and return its answer, whatever its exit status.

    `NotRun` when it cannot start, `NoAnswer` when it is still running after `timeout_s`.
    """
    env = allowed_environment(environ)
    program = shutil.which(argv[0], path=env.get("PATH"))
    if program is None:
        raise NotRun.missing(argv[0])
    try:
        done = subprocess.run(
            [program, *argv[1:]],
            env=env,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout_s,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as exc:
        raise NoAnswer(argv[0], timeout_s) from exc
    except OSError as exc:
        raise NotRun.refused(argv[0], exc) from exc
    return Answer(tuple(argv), done.returncode, done.stdout, done.stderr)


def version(environ: Mapping[str, str] | None = None) -> str | None:
    """What ``scontrol --version`` prints ("slurm 22.05.8"); None without an answer."""
    try:
        answer = run(["scontrol", "--version"], environ=environ, timeout_s=IN_JOB_TIMEOUT_S)
    except SlurmError:
        return None
    lines = [line for line in answer.stdout.splitlines() if line.strip()]
    return lines[0] if answer.ok and lines else None
