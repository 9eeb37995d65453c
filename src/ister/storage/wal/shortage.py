"""A WAL's episodes of running short of disk space or file descriptors.

A full disk (ENOSPC, EDQUOT) while writing a group is not a failure of the WAL, nor is running out of
file descriptors (EMFILE, ENFILE) when opening a segment: the writer refuses the group and everything
queued behind it with `DiskFull` / `StorageExhausted` (retriable), and the next append tries again.
`Shortage` names the error and logs an episode once when it starts and once when writes resume, with
how many appends it refused meanwhile. Used by the writer's pool thread only.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from ister.errors import DiskFull, StorageExhausted

from .durable import NO_FD_ERRNOS

log = logging.getLogger(__name__)


class Shortage:
    # slots: one per reliable topic's writer (100,000 of them)
    __slots__ = ("_directory", "_refused", "_since", "_what")

    def __init__(self, directory: Path) -> None:
        self._directory = directory
        self._since: float | None = None  # monotonic start of the current episode
        self._refused = 0
        self._what = "disk space"

    def error(self, cause: OSError) -> StorageExhausted:
        """The error the appends refused because of `cause` get."""
        if cause.errno in NO_FD_ERRNOS:
            return StorageExhausted(
                f"too many open files: cannot open a WAL segment in {self._directory}: "
                f"{cause.strerror or cause}"
            )
        return DiskFull(f"disk full: cannot write to the WAL in {self._directory}: {cause.strerror or cause}")

    def refused(self, err: StorageExhausted, appends: int) -> None:
        """`appends` were refused with `err`: the episode starts (logged), or goes on."""
        if self._since is None:
            self._what = what = "disk space" if isinstance(err, DiskFull) else "a file descriptor"
            log.error(
                "WAL %s: %s; appends are refused (retriable) until %s is available",
                self._directory,
                err,
                what,
            )
            self._since = time.monotonic()
        self._refused += appends

    def written(self) -> None:
        """A group was written: an episode in course ends."""
        if self._since is None:
            return
        log.warning(
            "WAL %s: %s is available again; writes resumed after %.1f s (%d appends refused)",
            self._directory,
            self._what,
            time.monotonic() - self._since,
            self._refused,
        )
        self._since = None
        self._refused = 0
