"""Files that are re-read when they change (certificates, keys, secrets), checked by a cheap stat."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

from ister.errors import ConfigError

log = logging.getLogger(__name__)

Stamp = tuple[tuple[int, int, int], ...]


def stamp(paths: Sequence[str]) -> Stamp:
    """(inode, size, mtime_ns) of each file: any rewrite or rename-over changes it."""
    out = []
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            out.append((0, 0, 0))
        else:
            out.append((st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(out)


def read_file(path: str, what: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {path}: {exc.strerror}") from None


class WatchedFiles:
    """A set of files read together; `changed()` tells (once per change) that they should be re-read."""

    def __init__(self, paths: Sequence[str]) -> None:
        self.paths = [p for p in paths if p]
        self._stamp = stamp(self.paths)

    def read(self) -> list[bytes]:
        self._stamp = stamp(self.paths)
        return [read_file(p, "file") for p in self.paths]

    def changed(self) -> bool:
        return stamp(self.paths) != self._stamp
