"""Who may open a WAL directory: one `Wal` per directory in this process, one process per lock root.

Inside the process a registry of open directories refuses a second `Wal` on the same directory. Across
processes an exclusive `flock` on a *lock root* does: by default the WAL directory itself, for a broker
its `<data_dir>/wal` directory, which covers every topic's WAL with one file descriptor (taken when the
broker starts, or by the first WAL opened under it, and released with the last one). Blocking; the
registry is guarded by a lock, so any thread may call these.
"""

from __future__ import annotations

import fcntl
import os
import threading
from collections.abc import Callable
from pathlib import Path

from ister.errors import StorageError

_guard = threading.Lock()
_open_dirs: set[str] = set()  # real paths of WAL directories open in this process
_roots: dict[str, list[int]] = {}  # real path of a lock root -> [fd holding its flock, users]


def _flock(root: str) -> int:
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise StorageError(
            f"WAL directory {root} is already open (locked by another process using the same data directory)"
        ) from None
    except BaseException:
        os.close(fd)
        raise
    return fd


class _Release:
    """Calling it gives back what was taken (once; later calls do nothing). A small object, not a closure:
    a broker holds one per open WAL."""

    __slots__ = ("_dir", "_done", "_root")

    def __init__(self, directory: str | None, root: str) -> None:
        self._dir = directory
        self._root = root
        self._done = False

    def __call__(self) -> None:
        if self._done:
            return
        self._done = True
        with _guard:
            if self._dir is not None:
                _open_dirs.discard(self._dir)
            held = _roots[self._root]
            held[1] -= 1
            if held[1] == 0:
                del _roots[self._root]
                os.close(held[0])


def _take_root(root: Path) -> str:
    """Take or share the lock on `root` (the guard held); returns its key."""
    root.mkdir(parents=True, exist_ok=True)
    key = os.path.realpath(root)
    entry = _roots.get(key)
    if entry is None:
        _roots[key] = entry = [_flock(key), 0]
    entry[1] += 1
    return key


def hold_root(root: Path) -> Callable[[], None]:
    """Take (or share) the cross-process lock on `root`; returns its release (call it once). Raises
    StorageError when another process holds it."""
    with _guard:
        return _Release(None, _take_root(root))


def claim_directory(directory: Path, root: Path | None = None) -> Callable[[], None]:
    """Claim an existing WAL directory for one `Wal`: refused (StorageError "already open") while another
    `Wal` of this process has it, or another process holds the lock root (`directory` by default). Returns
    the release (call it once, when the `Wal` is closed)."""
    key = os.path.realpath(directory)
    with _guard:
        if key in _open_dirs:
            raise StorageError(f"WAL directory {directory} is already open (locked by another Wal)")
        root_key = _take_root(root if root is not None else directory)
        _open_dirs.add(key)
        return _Release(key, root_key)


def roots_held() -> int:
    """How many lock roots this process holds (each costs one file descriptor)."""
    with _guard:
        return len(_roots)
