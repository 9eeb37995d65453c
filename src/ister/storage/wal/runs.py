"""A run of committed records named by its place in a segment file, for a reader in another process.

`locate` (the broker, no I/O) turns offsets first..end-1 into (segment file, byte position of an indexed
frame at or before `first`, that frame's offset); `read_run` (any process, blocking) reads the frames from
there and returns the payloads, checking every frame's CRC-32C and the offsets' continuity. The table worker
reads the records it commits this way, so the broker neither reads nor ships them (docs/tables.md, "Where
the records come from"). Anything unexpected (the file deleted by retention, cut, damaged) raises
`RunUnreadable`: the caller then reads the records as any reader does.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ister.core.frames import scan_frames, split_dense_from
from ister.limits import MiB

if TYPE_CHECKING:
    from .wal import Wal

READ_CHUNK = 4 * MiB


class RunUnreadable(Exception):
    """The run's frames are not in its file as `locate` saw them."""


@dataclass(frozen=True, slots=True)
class WalRun:
    path: str  # the segment file
    position: int  # byte position of the frame of offset `at`
    at: int  # <= first: the sparse index's entry (the frames from `at` to `first` are skipped)
    first: int
    end: int  # one past the last offset

    @property
    def count(self) -> int:
        return self.end - self.first


def locate(wal: Wal, first: int, end: int) -> WalRun | None:
    """Offsets first..end-1 as a run of one segment file of `wal`, or None when the file alone does not
    hold them as readers may see them: not all committed, below the WAL's first offset, crossing a segment
    or a hole (lost or damaged range), or the WAL being cut."""
    if not wal.first_offset <= first < end <= wal.committed_offset or wal._cutting:
        return None
    if any(a < end and first < b for a, b in wal.holes()):
        return None
    seg = None
    for s in wal.segments_snapshot():
        if s.first_offset > first:
            break
        seg = s
    if seg is None or end > seg.end_offset:
        return None
    found = seg.index.floor(first)
    at, position = found if found is not None else (seg.first_offset, 0)
    return WalRun(str(seg.path), position, at, first, end)


def read_run(run: WalRun, chunk: int = READ_CHUNK) -> list[bytes]:
    """The payloads of the run's offsets (blocking). RunUnreadable when the file is gone or ends early, or
    a frame fails its CRC, carries another offset or an impossible length."""
    try:
        fd = os.open(run.path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise RunUnreadable(f"{run.path} is gone") from None
    try:
        return _read(fd, run, chunk)
    finally:
        os.close(fd)


def _read(fd: int, run: WalRun, chunk: int) -> list[bytes]:
    out: list[bytes] = []
    buf = b""
    buf_pos = run.position  # file position of buf[0]
    cur = 0  # parsing resumes at buf[cur]
    expect = run.at
    want = chunk
    while expect < run.end:
        data = os.pread(fd, want, buf_pos + len(buf))
        if not data:
            raise RunUnreadable(f"{run.path} ends at byte {buf_pos + cur}, before offset {expect}")
        buf = buf[cur:] + data if cur < len(buf) else data
        buf_pos += cur
        cur = 0
        needed = 0
        problem: str | None = None
        if expect < run.first:  # headers only up to `first`
            res = scan_frames(
                memoryview(buf), 0, expect, verify_crc=False, collect=False, max_frames=run.first - expect
            )
            problem = res.stop if res.stop in ("gap", "too_large") else None
            cur, needed = res.safe_length, res.needed
            expect += res.count
        if expect >= run.first and problem is None:
            payloads, cur, needed, problem = split_dense_from(buf, cur, expect, run.end - expect)
            out += payloads
            expect += len(payloads)
        if problem is not None:
            raise RunUnreadable(f"{run.path}: {problem} at byte {buf_pos + cur} (offset {expect})")
        want = max(chunk, needed)
    return out


__all__ = ["RunUnreadable", "WalRun", "locate", "read_run"]
