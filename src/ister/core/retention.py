"""Retention: which whole units of a topic's log may be deleted, and the topic's start offset after that.

A unit is a piece of the log that is stored and deleted as one (a durable object with its Parquet copy and
descriptor, or a WAL segment file when there is no durable tier), known by its offsets [first, end), its
size and the newest publish time of its records (or a later time standing in for it, such as the export
or file time: a unit is then kept longer, never shorter).

The rules (Kafka's `retention.ms` / `retention.bytes`, on whole units, oldest first):
- by time: a unit whose newest record is older than `time_ms` may go;
- by size: while the units left after deleting the oldest would still hold at least `size_bytes`, it may go
  (so at least `size_bytes` stay, as in Kafka);
- a unit holding anything at or past `safe_end` (not yet exported, or not yet committed on enough
  replicas) never goes, nor does any unit after it: only a prefix of the log is deleted;
- the start offset never moves backwards, and offsets are never reused.
A limit of 0 is unlimited. Pure: time is an argument.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from ister.core.timespec import UNIT_MS
from ister.errors import InvalidArgument
from ister.ids import shown

SECOND_MS = 1_000
DAY_MS = 86_400 * SECOND_MS
DEFAULT_RETENTION_TIME_MS = 7 * DAY_MS  # as Kafka's retention.ms
MAX_RETENTION_MS = 100 * 365 * DAY_MS
MAX_RETENTION_BYTES = 2**62


@dataclass(frozen=True, slots=True)
class RetentionLimits:
    time_ms: int = DEFAULT_RETENTION_TIME_MS  # 0: unlimited
    size_bytes: int = 0  # 0: unlimited

    def __post_init__(self) -> None:
        if not 0 <= self.time_ms <= MAX_RETENTION_MS or not 0 <= self.size_bytes <= MAX_RETENTION_BYTES:
            raise InvalidArgument(
                f"retention limits out of range: {self.time_ms} ms, {self.size_bytes} bytes"
            )

    @property
    def unlimited(self) -> bool:
        return not self.time_ms and not self.size_bytes


@dataclass(frozen=True, slots=True)
class Unit:
    first: int
    end: int  # exclusive
    size: int
    newest_ms: int  # the newest record's publish time, or a later stand-in (Unix ms)


def plan(
    units: Sequence[Unit], limits: RetentionLimits, now_ms: int, safe_end: int, start: int
) -> tuple[int, list[Unit]]:
    """(the new start offset, the units to delete, oldest first). `units` ascending by offset; units wholly
    below `start` (left over from an earlier pass) are always returned for deletion."""
    out: list[Unit] = []
    new_start = start
    remaining = sum(u.size for u in units if u.end > start)
    expired_before = now_ms - limits.time_ms
    for unit in units:
        if unit.end <= start:
            out.append(unit)  # already below the start offset: only its files are left to delete
            continue
        if unit.end > safe_end:
            break
        by_time = limits.time_ms > 0 and unit.newest_ms < expired_before
        by_size = limits.size_bytes > 0 and remaining - unit.size >= limits.size_bytes
        if not (by_time or by_size):
            break
        out.append(unit)
        remaining -= unit.size
        new_start = max(new_start, unit.end)
    return new_start, out


_DURATION = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)?\s*$")
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgtp]?i?b?)?\s*$", re.IGNORECASE)
_SIZE_FACTOR = {"": 1, "b": 1, "k": 1000, "m": 1000**2, "g": 1000**3, "t": 1000**4, "p": 1000**5}


def parse_duration_ms(text: str) -> int:
    """`30s`, `10m`, `12h`, `7d`, `2w`, `500ms`, a bare number of seconds; `0` = unlimited."""
    m = _DURATION.match(text)
    if m is None or m.group(1).startswith("-"):
        raise InvalidArgument(f"invalid duration {shown(text)}: expected e.g. 30s, 10m, 12h, 7d or 0")
    value = float(m.group(1)) * UNIT_MS[m.group(2) or "s"]
    if value > MAX_RETENTION_MS:
        raise InvalidArgument(f"duration {shown(text)} is longer than 100 years")
    return int(value)


def parse_size_bytes(text: str) -> int:
    """`512MiB`, `50GiB`, `10GB`, `1000`, `0` = unlimited (KiB/MiB/GiB/TiB are powers of 1024)."""
    m = _SIZE.match(text)
    if m is None:
        raise InvalidArgument(f"invalid size {shown(text)}: expected e.g. 512MiB, 50GiB or 0")
    unit = (m.group(2) or "").lower()
    binary = "i" in unit
    letter = unit[:1] if unit[:1] != "b" else ""
    factor = (1024 ** "_kmgtp".index(letter)) if binary and letter else _SIZE_FACTOR[letter]
    value = int(float(m.group(1)) * factor)
    if value > MAX_RETENTION_BYTES:
        raise InvalidArgument(f"size {shown(text)} is too large")
    return value


def format_duration_ms(ms: int) -> str:
    if ms == 0:
        return "unlimited"
    for suffix, factor in (("d", DAY_MS), ("h", 3_600_000), ("m", 60_000), ("s", 1_000)):
        if ms % factor == 0:
            return f"{ms // factor}{suffix}"
    return f"{ms}ms"


def format_size_bytes(n: int) -> str:
    if n == 0:
        return "unlimited"
    for suffix, factor in (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n % factor == 0:
            return f"{n // factor}{suffix}"
    return f"{n}B"


@dataclass(frozen=True, slots=True)
class BacklogQuota:
    """The most a topic's slowest subscription may be behind (0 = no limit), and what happens past it."""

    size_bytes: int = 0
    time_ms: int = 0
    policy: str = "producer_error"  # producer_error | producer_hold | consumer_eviction

    @property
    def unlimited(self) -> bool:
        return not self.size_bytes and not self.time_ms


def quota_breach(
    quota: BacklogQuota, subscription: str, backlog_bytes: int, oldest_ms: int | None, now_ms: int
) -> str | None:
    """Why the slowest subscription's backlog is past the quota (None: it is not). `oldest_ms` is the publish
    time of its oldest unacknowledged message (None: no backlog)."""
    if quota.size_bytes and backlog_bytes > quota.size_bytes:
        return (
            f"backlog quota exceeded: subscription {subscription!r} is {format_size_bytes(backlog_bytes)} "
            f"behind, more than {format_size_bytes(quota.size_bytes)}"
        )
    if quota.time_ms and oldest_ms is not None and now_ms - oldest_ms > quota.time_ms:
        return (
            f"backlog quota exceeded: subscription {subscription!r} has a message unacknowledged for "
            f"{format_duration_ms(now_ms - oldest_ms)}, more than {format_duration_ms(quota.time_ms)}"
        )
    return None
