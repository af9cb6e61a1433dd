"""Writing and reading files safely: the atomic write, the durable line append, the guarded
read of a file another user could have planted, and directories made with the results mode.

Every file is created with exactly the mode asked for, whatever the umask: the results
mode for results (default 0640: a research group may read them), 0600 for private state.
Directories get the x bit wherever the file mode has r, so 0640 makes 0750 directories.
"""

from __future__ import annotations

import contextlib
import errno
import os
import pwd
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path

from pytest_haico.errors import StackError, UntrustedFileError

DEFAULT_FILE_MODE = 0o640
PRIVATE_FILE_MODE = 0o600
# A results file read whole (a run's claim, run-config, timeline and samples; a transcript;
# a share's claim): far above what a run writes, so a damaged one costs an error, not memory.
RESULTS_FILE_MAX_BYTES = 256 * 1024 * 1024


def dir_mode(file_mode: int) -> int:
    """The directory mode that goes with a file mode: x wherever r is set."""
    return file_mode | ((file_mode & 0o444) >> 2)


def make_dirs(path: Path, file_mode: int) -> None:
    """`mkdir -p` that gives every directory it creates `dir_mode(file_mode)`, whatever the
    umask; directories that exist are left as they are (the user may have widened them).

    Safe against other processes making the same directories at the same moment (array
    tasks starting together): a directory that appears meanwhile is taken as it is. Raises
    `NotADirectoryError` where something that is not a directory stands in the way.
    """
    missing: list[Path] = []
    current = path
    while not current.is_dir():
        missing.append(current)
        if current.parent == current:
            break
        current = current.parent
    mode = dir_mode(file_mode)
    for directory in reversed(missing):
        try:
            directory.mkdir(mode)
        except FileExistsError:
            if directory.is_dir():
                continue  # made by a concurrent process meanwhile: theirs has the mode too
            raise NotADirectoryError(
                errno.ENOTDIR, "exists and is not a directory", str(directory)
            ) from None
        os.chmod(directory, mode)  # mkdir's mode went through the umask


def create_file(path: Path, file_mode: int, *, flags: int = os.O_WRONLY) -> int:
    """Create `path` (it must not exist, nor be a symlink) with exactly `file_mode`; return
    the open descriptor. The mode is never wider than `file_mode`, not even for a moment."""
    fd = os.open(path, flags | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, file_mode)
    try:
        os.fchmod(fd, file_mode)  # the mode given to open went through the umask
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_all(fd: int, data: bytes) -> None:
    """`os.write` until all of `data` is written (a write may take only part of it)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def fsync_dir(path: Path) -> None:
    """Make the names in directory `path` durable (a rename, a link, a new file)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    except OSError as exc:
        # Some network file systems refuse fsync on a directory; their renames are then as
        # durable as they make them.
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP):
            raise
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_file(path: Path, *, mode: int) -> Iterator[int]:
    """A descriptor to write the new content of `path` to: on a clean exit it is fsynced
    and renamed over `path` (whole or not at all, the directory fsynced); on an exception
    nothing is left behind and `path` is as it was."""
    temp, fd = _create_temp(path, mode)
    try:
        try:
            yield fd
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def write_atomic(path: Path, data: bytes, *, mode: int) -> None:
    """Replace `path` by a file of `data` with exactly `mode`: readers see the old file or
    the new one, never a part of it (temporary name, write-all, fsync, rename)."""
    with atomic_file(path, mode=mode) as fd:
        write_all(fd, data)


def publish_file(partial: Path, path: Path, *, mode: int) -> None:
    """Rename `partial`, complete (another program wrote it), to `path`: its mode made
    exactly `mode`, its data fsynced first and the directory after."""
    fd = os.open(partial, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.fchmod(fd, mode)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(partial, path)
    fsync_dir(path.parent)


def link_new_file(path: Path, data: bytes, *, mode: int) -> bool:
    """Create `path` holding `data`, complete from its first moment; False if it exists.

    A hard link of a fsynced temporary file: atomic on every file system, NFS included,
    and it never replaces a file another process made.
    """
    temp, fd = _create_temp(path, mode)
    try:
        try:
            write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(temp, path)
            linked = True
        except FileExistsError:
            # Over NFS a retried link can report EEXIST for its own success.
            linked = os.stat(temp).st_nlink == 2
    finally:
        temp.unlink(missing_ok=True)
    if linked:
        fsync_dir(path.parent)
    return linked


def _create_temp(path: Path, mode: int) -> tuple[Path, int]:
    """A new hidden file next to `path` (same directory, so a rename is atomic) and its
    descriptor; the random part keeps processes and threads, on any host, apart."""
    temp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    return temp, create_file(temp, mode)


def open_for_append(path: Path, *, mode: int) -> int:
    """A descriptor appending to `path`, which is created with exactly `mode` if missing."""
    flags = os.O_WRONLY | os.O_APPEND
    try:
        return create_file(path, mode, flags=flags)
    except FileExistsError:
        return os.open(path, flags | os.O_CLOEXEC)


def ends_inside_a_line(path: Path) -> bool:
    """Whether the file's last byte is not a newline (True when it cannot be read: an
    extra newline costs an empty line, which readers skip; a missing one costs a record)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return True
    try:
        size = os.fstat(fd).st_size
        return size > 0 and os.pread(fd, 1, size - 1) != b"\n"
    except OSError:
        return True
    finally:
        os.close(fd)


def append_line(path: Path, line: bytes, *, mode: int) -> None:
    """Append one newline-terminated line with a single write, then fsync; a line a killed
    writer left unfinished is ended first, so it never swallows this one."""
    fd = open_for_append(path, mode=mode)
    try:
        write_all(fd, b"\n" + line if ends_inside_a_line(path) else line)
        os.fsync(fd)
    finally:
        os.close(fd)


def ownership_problem(info: os.stat_result, *, uid: int | None = None) -> str | None:
    """What makes a stat result untrustworthy (None: owned by `uid`, writable by it only)."""
    uid = os.geteuid() if uid is None else uid
    if stat.S_ISLNK(info.st_mode):
        return "is a symbolic link"
    if info.st_uid != uid:
        return f"is owned by {_user(info.st_uid)}, not by {_user(uid)}"
    bits = (("group", stat.S_IWGRP), ("others", stat.S_IWOTH))
    writable = [who for who, bit in bits if info.st_mode & bit]
    if writable:
        return f"is writable by {' and '.join(writable)} (mode {stat.S_IMODE(info.st_mode):04o})"
    return None


def _user(uid: int) -> str:
    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"


def read_owned_file(path: Path, *, uid: int | None = None, private: bool = False) -> bytes:
    """The content of `path` if it is a regular file of ours (of `uid`, when given) that
    nobody else may write (`private`, a secret: nor read).

    Raises `UntrustedFileError` if it is not, `FileNotFoundError` if it does not exist.
    Opened without following a symlink and without waiting for a FIFO's writer, and
    judged by the opened file, so a swap between the check and the read changes nothing.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise
    except OSError as exc:
        if exc.errno == errno.ELOOP or os.path.islink(path):
            raise UntrustedFileError(path, "is a symbolic link") from exc
        raise UntrustedFileError(path, f"cannot be opened: {exc.strerror}") from exc
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        problem = ownership_problem(info, uid=uid)
        if problem is None and not stat.S_ISREG(info.st_mode):
            problem = "is not a regular file"
        if problem is None and private and info.st_mode & 0o077:
            problem = (
                f"is open to its group or others (mode {stat.S_IMODE(info.st_mode):04o}): "
                f"chmod 600 {path}"
            )
        if problem is not None:
            raise UntrustedFileError(path, problem)
        return handle.read()


class NotAnInputError(ValueError):
    """An input (an arm file, a script file) that is not a regular file, or over its bound;
    `problem` says which, as a sentence's end ("is a FIFO, not a regular file")."""

    def __init__(self, path: Path, problem: str) -> None:
        super().__init__(f"{path} {problem}")
        self.path = path
        self.problem = problem


def read_input_file(path: Path, *, max_bytes: int) -> bytes:
    """The content of the regular file `path` (a symlink to one is followed), if it has at
    most `max_bytes`; else `NotAnInputError`.

    Opened without waiting for a FIFO's writer and judged by the opened file, so a FIFO,
    a device or a directory is refused at once instead of blocking the reader forever.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise NotAnInputError(path, f"is a {file_kind(info.st_mode)}, not a regular file")
        if info.st_size > max_bytes:
            raise NotAnInputError(path, f"has {info.st_size} bytes, more than {max_bytes}")
        return handle.read(max_bytes + 1)


def shown_path(path: Path, here: Path | None = None) -> str:
    """`path` for a person: relative to `here` (default: the working directory) when under
    it, else under `~/` when under the home directory, else absolute."""
    path = Path(path).absolute()
    with contextlib.suppress(OSError):  # no working directory
        base = (here or Path.cwd()).absolute()
        if path.is_relative_to(base):
            return os.path.relpath(path, base)
    with contextlib.suppress(RuntimeError):  # no home directory
        if path.is_relative_to(Path.home()):
            return "~/" + os.path.relpath(path, Path.home())
    return str(path)


def file_kind(mode: int) -> str:
    """What a stat mode is, in words: "regular file", "FIFO", "symbolic link", ..."""
    kinds = (
        (stat.S_ISREG, "regular file"),
        (stat.S_ISDIR, "directory"),
        (stat.S_ISLNK, "symbolic link"),
        (stat.S_ISFIFO, "FIFO"),
        (stat.S_ISSOCK, "socket"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
    )
    return next((name for test, name in kinds if test(mode)), "special file")


def read_results_file(path: Path) -> bytes:
    """A file of a results tree, which may be another user's (`haico compare` with a
    colleague's campaign): `read_input_file`'s checks, so a FIFO there cannot hang a report
    or a run; `NotAnInputError` (a ValueError) names what it is instead."""
    return read_input_file(path, max_bytes=RESULTS_FILE_MAX_BYTES)


_WRITE_FIXES = {
    errno.ENOSPC: "free space on that file system",
    errno.EDQUOT: "free space within your quota on that file system",
    errno.EROFS: "make that file system writable",
    errno.EACCES: "make the {owner} writable for this user",
    errno.EPERM: "make the {owner} writable for this user",
}


def describe_write_failure(what: str, path: Path, exc: OSError, *, owner: str) -> str:
    """One line for a results file a run could not write: what, where, the OS error, the file
    system and the fix (`owner`: what a permission fix is about, "ledger", "transcript")."""
    fix = _WRITE_FIXES.get(exc.errno or 0, "repair that file system").format(owner=owner)
    return (
        f"cannot {what} {path}: [Errno {exc.errno}] {exc.strerror} on "
        f"{describe_filesystem(path)}. {fix.capitalize()}, or choose another results "
        "directory (--haico-results, CLUSTER_WORK), then rerun the same command: the items "
        "not done run again"
    )


def start_write_error(what: str, path: Path, exc: OSError, *, owner: str) -> StackError:
    """A file of the run directory written as the stack starts could not be written (a full
    disk, a quota, a read-only file system): the stack does not start, and the haico summary
    says where, on which file system, and the fix; the brief names only the file."""
    return StackError(
        describe_write_failure(what, path, exc, owner=owner),
        brief=f"cannot {what}: {exc.strerror} (where and the fix: the haico summary)",
    )


def describe_filesystem(path: Path) -> str:
    """The file system `path` is on, for a message: its mount point, type, source and device."""
    existing = Path(os.path.abspath(path))
    while not existing.exists() and existing.parent != existing:
        existing = existing.parent
    real = os.path.realpath(existing)
    try:
        device = os.stat(real).st_dev
        where = f"device {os.major(device)}:{os.minor(device)}"
    except OSError:
        where = "device unknown"
    mount = _mount_of(real)
    if mount is None:
        return f"the file system holding {real} ({where})"
    point, fstype, source = mount
    return f"the file system mounted at {point} ({fstype} from {source}, {where})"


def _mount_of(real: str) -> tuple[str, str, str] | None:
    """(mount point, type, source) of the longest mount point above `real` in mountinfo."""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return None
    best: tuple[str, str, str] | None = None
    for line in lines:
        before, _, after = line.partition(" - ")
        fields, tail = before.split(), after.split()
        if len(fields) < 5 or len(tail) < 2:
            continue
        point = _unescape(fields[4])
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        # A later line for the same point is a mount stacked over the earlier one.
        if inside and (best is None or len(point) >= len(best[0])):
            best = (point, tail[0], _unescape(tail[1]))
    return best


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field
