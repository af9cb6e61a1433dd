"""Files and directories under the results root: created with the results mode whatever the
umask, written whole or not at all, and the file system they live on named when that fails.

The results mode is a file mode (default 0640: a research group may read the results);
directories get the x bit wherever the mode has r, so 0640 makes 0750 directories.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

DEFAULT_FILE_MODE = 0o640


def dir_mode(file_mode: int) -> int:
    """The directory mode that goes with a file mode: x wherever r is set."""
    return file_mode | ((file_mode & 0o444) >> 2)


def make_dirs(path: Path, file_mode: int) -> None:
    """`mkdir -p` that gives every directory it creates `dir_mode(file_mode)`, whatever the
    umask; directories that exist are left as they are (the user may have widened them)."""
    missing: list[Path] = []
    current = path
    while not current.is_dir():
        if current.exists() or current.is_symlink():
            raise NotADirectoryError(errno.ENOTDIR, "exists and is not a directory", str(current))
        missing.append(current)
        if current.parent == current:
            break
        current = current.parent
    mode = dir_mode(file_mode)
    for directory in reversed(missing):
        try:
            directory.mkdir(mode)
        except FileExistsError:
            if not directory.is_dir():
                raise
            continue  # made by a concurrent run meanwhile: theirs has the mode too
        os.chmod(directory, mode)  # mkdir's mode went through the umask


def create_file(path: Path, file_mode: int, flags: int = os.O_WRONLY) -> int:
    """Create `path` (it must not exist) with exactly `file_mode`; return the open descriptor."""
    fd = os.open(path, flags | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, file_mode)
    try:
        os.fchmod(fd, file_mode)  # the mode given to open went through the umask
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_fully(fd: int, data: bytes) -> None:
    """`os.write` until all of `data` is written (a write may take only part of it)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def ends_inside_a_line(path: Path) -> bool:
    """Whether the file's last byte is not a newline (True when it cannot be read: an
    extra newline costs an empty line, which readers skip; a missing one costs a record)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return True
    try:
        size = os.fstat(fd).st_size
        return size > 0 and os.pread(fd, 1, size - 1) != b"\n"
    except OSError:
        return True
    finally:
        os.close(fd)


def append_line(path: Path, line: bytes, file_mode: int) -> None:
    """Append one newline-terminated line with a single write, then fsync; a line a killed
    writer left unfinished is ended first, so it never swallows this one."""
    flags = os.O_WRONLY | os.O_APPEND
    try:
        fd = create_file(path, file_mode, flags)
    except FileExistsError:
        fd = os.open(path, flags | os.O_CLOEXEC)
    try:
        write_fully(fd, b"\n" + line if ends_inside_a_line(path) else line)
        os.fsync(fd)
    finally:
        os.close(fd)


def write_new_file(path: Path, data: bytes, file_mode: int) -> None:
    """Write `path` whole or not at all: a temporary name, fsync, then an atomic rename.

    Readers never see a partial file; on failure nothing is left behind. An existing
    file at `path` is replaced.
    """
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        fd = create_file(temp, file_mode)
        try:
            write_fully(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise


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
