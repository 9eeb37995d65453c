"""WAL settings."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ister.core.frames import INDEX_EVERY_BYTES, INDEX_EVERY_FRAMES
from ister.errors import ConfigError
from ister.limits import MiB

FsyncMode = Literal["always", "interval"]


@dataclass(frozen=True)
class WalConfig:
    fsync: FsyncMode = "always"
    # interval mode: fdatasync at most this often; appends resolve once written (page cache).
    fsync_interval_ms: int = 50
    # rotate (between frame groups) once the active segment reached this size
    segment_max_bytes: int = 64 * MiB
    # also rotate once the active segment is this old (and not empty), so the durable tier gets closed
    # segments to export on quiet topics too; 0 = size only
    segment_max_age_s: float = 0.0
    # bounded in-memory cache of recent committed records (payload bytes + 16 per record)
    cache_max_bytes: int = 32 * MiB
    # allocate the active segment's file this far ahead of its data at most (0: never): fdatasync then
    # flushes data without a file-size change to journal (writer.py, "Preallocation")
    preallocate_bytes: int = 1 * MiB
    # fsync always: when appends come faster than this, the writer waits this long before taking a group
    # that is its only work, so that one fdatasync serves more of them (writer.py, "Group linger"); 0 = off
    group_linger_us: int = 400
    # cap on one write()+fsync group (a single larger append is still written as one group)
    max_write_bytes: int = 8 * MiB
    # back-pressure: appends wait while this many encoded bytes are queued but not yet committed
    max_queued_bytes: int = 64 * MiB
    # sparse index density (entries per segment: every N frames or N bytes, whichever first)
    index_every_frames: int = INDEX_EVERY_FRAMES
    index_every_bytes: int = INDEX_EVERY_BYTES
    # how long close() waits for the writer thread to stop
    close_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        if self.fsync not in ("always", "interval"):
            raise ConfigError(f"wal.fsync must be 'always' or 'interval', not {self.fsync!r}")
        for name in (
            "fsync_interval_ms",
            "segment_max_bytes",
            "max_write_bytes",
            "max_queued_bytes",
            "index_every_frames",
            "index_every_bytes",
        ):
            if getattr(self, name) < 1:
                raise ConfigError(f"wal.{name} must be >= 1")
        if self.segment_max_age_s < 0:
            raise ConfigError("wal.segment_max_age_s must be >= 0")
        if self.cache_max_bytes < 0:
            raise ConfigError("wal.cache_max_bytes must be >= 0")
        if self.preallocate_bytes < 0:
            raise ConfigError("wal.preallocate_bytes must be >= 0")
        if self.group_linger_us < 0:
            raise ConfigError("wal.group_linger_us must be >= 0")
        if self.close_timeout_s <= 0:
            raise ConfigError("wal.close_timeout_s must be > 0")
