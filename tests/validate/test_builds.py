"""`haico validate`'s builds: a command or a commit, and a commit's temporary worktree."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from pytest_haico.validate.builds import (
    Build,
    ValidateError,
    checked_out,
    refuse_the_same_build,
    resolve_build,
)

# Each test runs a child process (the fast loop, `-m "not slow"`, leaves them out).
pytestmark = pytest.mark.subprocess

TEMPLATE = "python backend.py --port {port}"


def _git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A backend's repository with two commits, and an uncommitted edit in its tree."""
    repo = tmp_path / "backend"
    repo.mkdir()
    _git(repo, "init", "-q")
    _git(repo, "config", "user.email", "dev@example.org")
    _git(repo, "config", "user.name", "dev")
    (repo / "backend.py").write_text("VERSION = 1\n")
    _git(repo, "add", "backend.py")
    _git(repo, "commit", "-qm", "first")
    (repo / "backend.py").write_text("VERSION = 2\n")
    _git(repo, "commit", "-qam", "second")
    (repo / "backend.py").write_text("VERSION = 3  # not committed\n")
    return repo


def test_a_commit_is_resolved_and_runs_as_the_template(repo: Path) -> None:
    first = _git(repo, "rev-parse", "HEAD~1")
    build = resolve_build("baseline", "HEAD~1", repo=repo, template=TEMPLATE)
    assert build == Build("baseline", "HEAD~1", TEMPLATE, repo, first)
    assert build.tree_identity() == f"git:{first}"
    by_hash = resolve_build("candidate", first[:10], repo=repo, template=TEMPLATE)
    assert by_hash.commit == first


def test_a_command_line_is_a_command_and_runs_in_the_repository(repo: Path) -> None:
    command = "python -m mybackend --port {port}"
    build = resolve_build("candidate", command, repo=repo, template=None)
    assert build == Build("candidate", command, command, repo, None)
    assert build.tree_identity().startswith(f"git:{_git(repo, 'rev-parse', 'HEAD')}+dirty:")
    # One word that is a program, or a file in the repository, is a command too.
    assert resolve_build("baseline", "python", repo=repo, template=None).commit is None
    assert resolve_build("baseline", "backend.py", repo=repo, template=None).commit is None


@pytest.mark.parametrize(
    ("given", "template", "message"),
    [
        ("HEAD", None, "--baseline 'HEAD' is commit {head} of {repo}: give --backend-cmd CMD, "
         "the command that runs the backend in a checkout of it (or set haico_backend_cmd)"),
        ("mian", TEMPLATE, "--baseline 'mian' is neither a commit of {repo} (git rev-parse) "
         "nor a command (no program 'mian'): give a commit, or the backend's command line"),
        ("  ", TEMPLATE, "--baseline is empty: give a commit or the backend's command line"),
        ("run 'x", TEMPLATE, "--baseline \"run 'x\": cannot split it: No closing quotation"),
    ],
)  # fmt: skip
def test_what_is_neither_a_commit_nor_a_command_is_one_line(
    repo: Path, given: str, template: str | None, message: str
) -> None:
    head = _git(repo, "rev-parse", "HEAD")[:12]
    with pytest.raises(ValidateError) as caught:
        resolve_build("baseline", given, repo=repo, template=template)
    assert str(caught.value) == message.format(head=head, repo=repo)


def test_two_builds_of_one_identity_are_refused(repo: Path) -> None:
    head = resolve_build("baseline", "HEAD", repo=repo, template=TEMPLATE)
    again = resolve_build(
        "candidate", _git(repo, "rev-parse", "HEAD"), repo=repo, template=TEMPLATE
    )
    with pytest.raises(ValidateError, match=r"are the same build .*: give two builds$"):
        refuse_the_same_build(head, again)
    command = resolve_build("candidate", "python -m x", repo=repo, template=None)
    refuse_the_same_build(head, command)  # another command: another build
    refuse_the_same_build(head, resolve_build("c", "HEAD~1", repo=repo, template=TEMPLATE))


def test_a_commit_runs_in_a_worktree_that_is_removed_and_the_tree_is_untouched(
    repo: Path,
) -> None:
    status, head = _git(repo, "status", "--porcelain"), _git(repo, "rev-parse", "HEAD")
    build = resolve_build("baseline", "HEAD~1", repo=repo, template=TEMPLATE)
    with checked_out(build) as where:
        assert where != repo
        assert (where / "backend.py").read_text() == "VERSION = 1\n"
        assert _git(where, "rev-parse", "HEAD") == build.commit
        assert str(where) in _git(repo, "worktree", "list")
    assert not where.exists()
    assert not where.parent.exists()
    assert len(_git(repo, "worktree", "list").splitlines()) == 1  # the repository's own only
    assert (repo / "backend.py").read_text() == "VERSION = 3  # not committed\n"
    assert _git(repo, "status", "--porcelain") == status
    assert _git(repo, "rev-parse", "HEAD") == head


def test_the_worktree_is_removed_on_ctrl_c_too(repo: Path) -> None:
    build = resolve_build("candidate", "HEAD", repo=repo, template=TEMPLATE)
    with pytest.raises(KeyboardInterrupt), checked_out(build) as where:
        (where / "build-output").write_text("left by a build")
        raise KeyboardInterrupt
    assert not where.parent.exists()
    assert len(_git(repo, "worktree", "list").splitlines()) == 1


def test_a_command_runs_in_the_repository_itself(repo: Path) -> None:
    build = resolve_build("candidate", "python -m x", repo=repo, template=None)
    with checked_out(build) as where:
        assert where == repo
    assert repo.is_dir()
