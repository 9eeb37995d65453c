"""Small durable-file helpers shared by the WAL's side files (blocking; run in a thread)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def fsync_dir(directory: Path) -> None:
    """Make the directory's entries (created, renamed, removed files) durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_file(directory: Path, name: str, data: bytes) -> None:
    """Atomically replace `directory/name` with `data`: `<name>.tmp`, fsync, rename, directory fsync.

    Raises OSError. A failure before the rename leaves the old file (the tmp file is removed); a failure
    of the directory fsync leaves the new file in place but perhaps not durable yet."""
    tmp = directory / (name + ".tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, directory / name)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(directory)


def remove_file(directory: Path, name: str) -> None:
    """Delete `directory/name` (if present) durably. Raises OSError."""
    (directory / name).unlink(missing_ok=True)
    fsync_dir(directory)


__all__ = ["fsync_dir", "remove_file", "replace_file"]
