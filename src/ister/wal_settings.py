"""WAL settings: the `wal:` block of the broker's configuration (`WalSettings`) and one WAL's settings
(`WalConfig`). Each setting has one default and one check, here; the broker's configuration embeds
`WalSettings` and the composition root turns it into the `WalConfig` every topic's WAL gets. Beside
`config.py`, below every layer, so that the configuration does not import storage."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import msgspec

from ister.core.frames import INDEX_EVERY_BYTES, INDEX_EVERY_FRAMES
from ister.errors import ConfigError
from ister.limits import MiB

FsyncMode = Literal["always", "interval"]

# An operator's segment size has this floor (a smaller one would rotate on every few frames); the WAL
# itself works with any size >= 1, which tests use to rotate often.
SETTING_SEGMENT_MIN_BYTES = 1024
MAX_GROUP_LINGER_US = 100_000


class WalSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """The `wal:` block (docs/configuration.md)."""

    fsync: FsyncMode = "always"
    fsync_interval_ms: int = 50
    segment_max_bytes: int = 64 * MiB
    cache_max_bytes: int = 32 * MiB  # per reliable topic
    cache_total_bytes: int = 256 * MiB  # all reliable topics' caches together; 0 = no shared cap
    writer_threads: int = 0  # threads writing and syncing every WAL of the broker; 0 = automatic (2 or 8)
    idle_close_seconds: float = 30.0  # a WAL's segment file is closed when not written for this long
    max_open_segments: int = 0  # segment files open for writing at most; 0 = RLIMIT_NOFILE / 4, <= 8192
    preallocate_bytes: int = 1 * MiB  # the active segment file is allocated up to this far ahead; 0 = off
    group_linger_us: int = 400  # fsync always: a busy WAL's writer waits this long to group appends; 0 = off

    def check(self) -> None:
        """The block's rules: those of one WAL (`WalConfig`), then the broker-wide ones (the writer pool's
        are `check_pool_settings`)."""
        self.wal_config()
        if self.segment_max_bytes < SETTING_SEGMENT_MIN_BYTES:
            raise ConfigError(f"wal.segment_max_bytes must be >= {SETTING_SEGMENT_MIN_BYTES}")
        if self.cache_total_bytes < 0:
            raise ConfigError("wal.cache_total_bytes must be >= 0 (0 = no shared cap)")
        check_pool_settings(self.writer_threads, self.idle_close_seconds, self.max_open_segments)

    def wal_config(self, *, segment_max_age_s: float = 0.0) -> WalConfig:
        """One WAL's settings from this block (`segment_max_age_s` comes from the durable tier's)."""
        return WalConfig(
            fsync=self.fsync,
            fsync_interval_ms=self.fsync_interval_ms,
            segment_max_bytes=self.segment_max_bytes,
            segment_max_age_s=segment_max_age_s,
            cache_max_bytes=self.cache_max_bytes,
            preallocate_bytes=self.preallocate_bytes,
            group_linger_us=self.group_linger_us,
        )


_BLOCK = WalSettings()  # the defaults WalConfig shares with the `wal:` block


MAX_THREADS = 64  # writer threads the pool may run


def check_pool_settings(threads: int, idle_close_s: float, max_open_files: int) -> None:
    """The pool's settings: the `wal:` block's writer_threads, idle_close_seconds and max_open_segments
    (checked here for the block too: one check each)."""
    if not 0 <= threads <= MAX_THREADS:
        raise ConfigError(f"wal.writer_threads must be in 0..{MAX_THREADS} (0 = automatic)")
    if idle_close_s <= 0:
        raise ConfigError("wal.idle_close_seconds must be > 0")
    if max_open_files < 0:
        raise ConfigError("wal.max_open_segments must be >= 0 (0 = automatic)")


@dataclass(frozen=True)
class WalConfig:
    fsync: FsyncMode = _BLOCK.fsync
    # interval mode: fdatasync at most this often; appends resolve once written (page cache).
    fsync_interval_ms: int = _BLOCK.fsync_interval_ms
    # rotate (between frame groups) once the active segment reached this size
    segment_max_bytes: int = _BLOCK.segment_max_bytes
    # also rotate once the active segment is this old (and not empty), so the durable tier gets closed
    # segments to export on quiet topics too; 0 = size only
    segment_max_age_s: float = 0.0
    # bounded in-memory cache of recent committed records (payload bytes + 16 per record)
    cache_max_bytes: int = _BLOCK.cache_max_bytes
    # allocate the active segment's file this far ahead of its data at most (0: never): fdatasync then
    # flushes data without a file-size change to journal (prealloc.py)
    preallocate_bytes: int = _BLOCK.preallocate_bytes
    # fsync always: when appends come faster than this, the writer waits this long before taking a group
    # that is its only work, so that one fdatasync serves more of them (linger.py); 0 = off
    group_linger_us: int = _BLOCK.group_linger_us
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
            raise ConfigError("wal.preallocate_bytes must be >= 0 (0 = off)")
        if not 0 <= self.group_linger_us <= MAX_GROUP_LINGER_US:
            raise ConfigError(f"wal.group_linger_us must be in 0..{MAX_GROUP_LINGER_US} (0 = off)")
        if self.close_timeout_s <= 0:
            raise ConfigError("wal.close_timeout_s must be > 0")
