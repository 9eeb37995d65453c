"""Small durable-file helpers shared by the WAL's side files (blocking; run in a thread)."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import sys
from collections.abc import Callable
from pathlib import Path

# Not failures of the WAL: a group that meets them is refused (retriable) and the next append tries again.
DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
NO_FD_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE})
EXHAUSTED_ERRNOS = DISK_FULL_ERRNOS | NO_FD_ERRNOS


def fsync_dir(directory: Path) -> None:
    """Make the directory's entries (created, renamed, removed files) durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_all(fd: int, data: bytes) -> None:
    """Write all of `data` to `fd` (os.write may write less than asked). Raises OSError."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def replace_file(directory: Path, name: str, data: bytes) -> None:
    """Atomically replace `directory/name` with `data`: `<name>.tmp`, fsync, rename, directory fsync.

    Raises OSError. A failure before the rename leaves the old file (the tmp file is removed); a failure
    of the directory fsync leaves the new file in place but perhaps not durable yet."""
    tmp = directory / (name + ".tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, directory / name)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(directory)


def _kernel_version() -> tuple[int, int]:
    try:
        major, minor = os.uname().release.split(".")[:2]
        return int(major), int("".join(c for c in minor if c.isdigit()) or 0)
    except ValueError:
        return (0, 0)


def _load_syncfs() -> Callable[[int], None] | None:
    """syncfs(2) from the C library (Linux; Python has no binding), or None where there is none or where it
    does not report write-back errors (kernels before 5.8)."""
    if not sys.platform.startswith("linux") or _kernel_version() < (5, 8):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).syncfs
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int]
    fn.restype = ctypes.c_int

    def syncfs(fd: int) -> None:
        if fn(fd) != 0:  # ctypes releases the GIL for the call
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))

    return syncfs


# Write back and wait for everything dirty on the filesystem holding `fd`, its data and metadata: one call
# for many files instead of an fdatasync each. Since Linux 5.8 it also reports writeback errors (once per
# open file description), which is what makes it usable as a durability point. None: not available.
syncfs: Callable[[int], None] | None = _load_syncfs()


def remove_file(directory: Path, name: str) -> None:
    """Delete `directory/name` (if present) durably. Raises OSError."""
    (directory / name).unlink(missing_ok=True)
    fsync_dir(directory)


__all__ = ["fsync_dir", "remove_file", "replace_file", "syncfs", "write_all"]
