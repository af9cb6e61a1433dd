"""The two backend builds `haico validate` compares: a command line, or a commit of the
backend's repository checked out into a temporary git worktree for its run (the
developer's tree is never touched; the worktree is removed afterwards, also on Ctrl-C)."""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from pytest_haico.config.identity import SourceTree, source_tree
from pytest_haico.errors import HaicoError
from pytest_haico.files import shown_path

GIT_TIMEOUT_S = 120.0


class ValidateError(HaicoError):
    """`haico validate` cannot run as asked; the message says what to give instead."""


@dataclass(frozen=True)
class Build:
    """One side of the comparison: `command` runs the backend (as `--haico-backend-cmd`
    takes it) in `repo`, or, for a commit, in a checkout of `commit`."""

    role: str  # baseline | candidate
    given: str
    command: str
    repo: Path
    commit: str | None = None

    def describe(self) -> str:
        if self.commit is None:
            return f"command {self.command!r} in {self.repo}"
        return (
            f"commit {self.commit[:12]} ({self.given}) of {shown_path(self.repo)}, run as "
            f"{self.command!r}"
        )

    def tree_identity(self) -> str:
        """The git part of the build's backend identity (`config.identity`)."""
        tree = SourceTree(self.repo, self.commit) if self.commit else source_tree(self.repo)
        return tree.identity


def resolve_build(role: str, given: str, *, repo: Path, template: str | None) -> Build:
    """A commit when git resolves `given` to one in `repo` (it then runs as `template`),
    else a command line whose program exists."""
    text = given.strip()
    if not text:
        raise ValidateError(f"--{role} is empty: give a commit or the backend's command line")
    commit = _commit(repo, text) if len(text.split()) == 1 else None
    if commit is not None:
        if not template:
            raise ValidateError(
                f"--{role} {given!r} is commit {commit[:12]} of {repo}: give --backend-cmd "
                "CMD, the command that runs the backend in a checkout of it (or set "
                "haico_backend_cmd)"
            )
        return Build(role, given, template, repo, commit)
    try:
        program = shlex.split(text)[0]
    except (ValueError, IndexError) as exc:
        raise ValidateError(f"--{role} {given!r}: cannot split it: {exc}") from None
    if len(shlex.split(text)) == 1 and not (shutil.which(program) or (repo / program).exists()):
        raise ValidateError(
            f"--{role} {given!r} is neither a commit of {repo} (git rev-parse) nor a "
            f"command (no program {program!r}): give a commit, or the backend's command line"
        )
    return Build(role, given, text, repo)


def refuse_the_same_build(baseline: Build, candidate: Build) -> None:
    """Two builds of one backend identity would share item ids: nothing to compare."""
    same = (baseline.command, baseline.tree_identity()) == (
        candidate.command,
        candidate.tree_identity(),
    )
    if same:
        raise ValidateError(
            f"--baseline {baseline.given!r} and --candidate {candidate.given!r} are the same "
            f"build ({candidate.command!r} at {candidate.tree_identity()}): give two builds"
        )


@contextlib.contextmanager
def checked_out(build: Build) -> Iterator[Path]:
    """The directory the build's command runs in: its repository, or for a commit a
    temporary worktree of it, removed on the way out whatever happened."""
    if build.commit is None:
        yield build.repo
        return
    parent = Path(tempfile.mkdtemp(prefix=f"haico-validate-{build.role}-"))
    tree = parent / "src"
    try:
        _git(build.repo, "worktree", "add", "--detach", "--quiet", str(tree), build.commit)
        yield tree
    finally:
        with contextlib.suppress(ValidateError):
            _git(build.repo, "worktree", "remove", "--force", str(tree))
        shutil.rmtree(parent, ignore_errors=True)
        with contextlib.suppress(ValidateError):
            _git(build.repo, "worktree", "prune")


def _commit(repo: Path, text: str) -> str | None:
    """The commit `text` names in `repo`, or None (not a commit, not a repository)."""
    if text.startswith("-"):
        return None
    try:
        return _git(repo, "rev-parse", "--verify", "--quiet", f"{text}^{{commit}}") or None
    except ValidateError:
        return None


def _git(repo: Path, *args: str) -> str:
    try:
        done = subprocess.run(
            ["git", "-C", str(repo), *args],
            capture_output=True,
            text=True,
            timeout=GIT_TIMEOUT_S,
            check=False,
            env={**os.environ, "GIT_TERMINAL_PROMPT": "0"},
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ValidateError(f"git {args[0]} in {repo}: {exc}") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["failed"])[-1]
        raise ValidateError(f"git {' '.join(args[:2])} in {repo}: {last}")
    return done.stdout.strip()
