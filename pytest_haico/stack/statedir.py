"""Private directories under $TMPDIR: the per-user state directory and what the plugin makes.

Other users share `$TMPDIR` (mode 1777 on most nodes) and can create any name in it
first, so a directory the plugin reuses is trusted only if `lstat` shows it is ours: a
real directory (no symlink), owned by this user and writable by nobody else. A file
the plugin reads back (a service registry, a port claim) must be ours too
(`pytest_haico.files.read_owned_file`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
from pathlib import Path

from pytest_haico.errors import StackError
from pytest_haico.files import ownership_problem

PREFIX = "pytest-haico-"
_FIX = (
    "remove it (as its owner or root) or set TMPDIR to a directory of your own "
    "(mode 0700), then run again"
)


def check_private_dir(path: Path, *, what: str, uid: int | None = None, fix: str = _FIX) -> None:
    """Refuse `path` unless it is a real directory owned by `uid` (default: us), private to it."""
    try:
        info = os.lstat(path)
    except OSError as exc:
        raise StackError(f"{what} {path} cannot be examined: {exc.strerror}; {fix}") from exc
    problem = ownership_problem(info, uid=uid)
    if problem is None and not stat.S_ISDIR(info.st_mode):
        problem = "is not a directory"
    if problem is not None:
        raise StackError(f"{what} {path} {problem}; {fix}")


def ensure_private_dir(path: Path, *, what: str, mode: int = 0o700, fix: str = _FIX) -> Path:
    """`path`, created with `mode` if missing; an existing one must pass `check_private_dir`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        path.mkdir(mode=mode)
    except FileExistsError:
        pass
    else:
        os.chmod(path, mode)  # mkdir's mode is cut by the umask; a traversable one must stay so
    check_private_dir(path, what=what, fix=fix)
    return path


def default_state_dir() -> Path:
    """The node-local, per-user directory for the service registry and port claims."""
    path = Path(tempfile.gettempdir()) / f"{PREFIX}{os.getuid()}"
    return ensure_private_dir(path, what="the pytest-haico state directory")


def resolve_state_dir(state_dir: Path | None) -> Path:
    """`state_dir` (checked, created if missing), else the default state directory."""
    if state_dir is None:
        return default_state_dir()
    return ensure_private_dir(
        state_dir,
        what="the pytest-haico state directory",
        fix="remove it or pass a directory of your own (mode 0700)",
    )


def make_owned_tempdir(name: str, *, mode: int = 0o700) -> Path:
    """A fresh directory `$TMPDIR/pytest-haico-<name>XXXXXXXX` of ours (the janitor may remove it).

    `mode` 0o711 lets a service running as another user reach what is inside by name.
    """
    path = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{name}"))
    if mode != 0o700:
        os.chmod(path, mode)
    return path


def cleanup_problem(path: Path, tmpdir: Path) -> str | None:
    """Why the janitor must not remove `path` (None: it lies in a directory the plugin made).

    The plugin makes its directories with `make_owned_tempdir` directly in `tmpdir` (the
    owner's recorded $TMPDIR): the first component of `path` below it must carry our
    prefix and be a real directory of ours, private to us, and `path` must still lie
    in it once every symlink on the way is resolved.
    """
    if not path.is_absolute() or not tmpdir.is_absolute():
        return "is not an absolute path"
    lexical = Path(os.path.normpath(path))
    real = Path(os.path.realpath(path))
    real_tmp = Path(os.path.realpath(tmpdir))
    try:
        parts = real.relative_to(real_tmp).parts
        lexical_parts = lexical.relative_to(Path(os.path.normpath(tmpdir))).parts
    except ValueError:
        return f"is not inside {tmpdir}, where the plugin makes its directories"
    if parts != lexical_parts:
        return f"leads elsewhere through a symbolic link (to {real})"
    if not parts or not parts[0].startswith(PREFIX):
        return f"is not inside a {PREFIX}* directory the plugin made in {tmpdir}"
    root = real_tmp / parts[0]
    try:
        info = os.lstat(root)
    except FileNotFoundError:
        return "is gone"
    problem = ownership_problem(info)
    if problem is None and not stat.S_ISDIR(info.st_mode):
        problem = "is not a directory"
    return None if problem is None else f"lies in {root}, which {problem}"


def remove_tree(path: Path) -> bool:
    """Remove `path` without following symlinks; whether it is gone."""
    if path.is_symlink() or not path.is_dir():
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    else:
        # rmtree walks by file descriptor and never follows a link planted inside.
        shutil.rmtree(path, ignore_errors=True)
    return not os.path.lexists(path)
