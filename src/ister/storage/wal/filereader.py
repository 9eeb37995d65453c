"""Reading committed records back from segment files (blocking; called through asyncio.to_thread).

Seeks with the segment's sparse index (or a resume hint from the previous read), reads bounded chunks,
validates every frame (CRC and offset continuity) and copies payloads out. A frame that fails validation
ends the records returned; a read that starts at it raises CorruptRange for the damaged range: that frame
alone when the next frame is found intact right after it, else the rest of the segment.
"""

from __future__ import annotations

import os
from bisect import bisect_right
from dataclasses import dataclass

from ister.core.frames import HEADER_SIZE, MAX_FRAME_PAYLOAD, payload_crc, scan_frames
from ister.errors import CorruptRange, OffsetOutOfRange
from ister.limits import MiB

from .segment import Segment

READ_CHUNK = 1 * MiB


@dataclass(frozen=True, slots=True)
class FilePosition:
    """Where a reader stopped: the frame of `offset` starts at byte `position` of segment `segment_first`."""

    segment_first: int
    offset: int
    position: int


def read_segments(
    segments: list[Segment],
    start: int,
    end: int,
    max_records: int,
    max_bytes: int,
    hint: FilePosition | None = None,
) -> tuple[list[tuple[int, bytes]], FilePosition]:
    """Records [start, ...) below `end` (the committed offset) from the segment holding `start`.

    Returns at least one record, at most max_records and about max_bytes of payload, stopping at the end of
    that segment; plus the position to resume from.
    """
    if start >= end:
        raise ValueError("nothing to read")
    firsts = [s.first_offset for s in segments]
    i = bisect_right(firsts, start) - 1
    if i < 0:
        raise OffsetOutOfRange(f"offset {start} is older than the oldest WAL segment")
    seg = segments[i]
    stop_offset = min(end, seg.end_offset)
    if start >= stop_offset:
        raise OffsetOutOfRange(f"offset {start} is not stored in the local WAL")
    found = seg.index.floor(start)
    offset, position = found if found is not None else (seg.first_offset, 0)
    if hint is not None and hint.segment_first == seg.first_offset and offset <= hint.offset <= start:
        offset, position = hint.offset, hint.position  # closer than the index entry
    try:
        fd = os.open(seg.path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError as exc:
        raise OffsetOutOfRange(f"WAL segment {seg.path} is gone (offset {start})") from exc
    try:
        return _read(fd, seg, start, stop_offset, max_records, max_bytes, offset, position)
    finally:
        os.close(fd)


def _read(
    fd: int,
    seg: Segment,
    start: int,
    stop_offset: int,
    max_records: int,
    max_bytes: int,
    offset: int,
    position: int,
) -> tuple[list[tuple[int, bytes]], FilePosition]:
    out: list[tuple[int, bytes]] = []
    nbytes = 0
    buf = b""
    buf_pos = position  # file position of buf[0]
    cur = 0  # scan resumes at buf[cur]
    expect = offset
    want = READ_CHUNK
    refill = True
    while expect < stop_offset and len(out) < max_records:
        if refill:
            data = os.pread(fd, want, buf_pos + len(buf))
            if not data:
                if out:
                    break
                raise CorruptRange(
                    f"WAL segment {seg.path} ends at byte {buf_pos + cur}; offset {expect} should be there",
                    expect,
                    seg.end_offset,
                )
            buf = buf[cur:] + data if cur < len(buf) else data
            buf_pos += cur
            cur = 0
        view = memoryview(buf)[cur:]
        if expect < start:  # seeking: headers only (frames before `start` are not returned)
            res = scan_frames(
                view, buf_pos + cur, expect, verify_crc=False, collect=False, max_frames=start - expect
            )
        else:
            limit = min(max_records - len(out), stop_offset - expect)
            res = scan_frames(view, buf_pos + cur, expect, max_frames=limit)
            for frame_offset, payload, frame_pos in res.frames:
                size = len(payload)
                if out and nbytes + size > max_bytes:
                    return out, FilePosition(seg.first_offset, frame_offset, frame_pos)
                out.append((frame_offset, bytes(payload)))
                nbytes += size
        cur += res.safe_length
        assert res.next_offset is not None
        expect = res.next_offset
        if res.stop in ("crc", "gap", "too_large"):
            if out:  # return what precedes the bad frame; the next read starts at it
                return out, FilePosition(seg.first_offset, expect, res.end_pos)
            end = seg.end_offset
            if res.stop == "crc" and _resumes_after(fd, res.end_pos, expect, stop_offset):
                end = expect + 1
            raise CorruptRange(
                f"WAL segment {seg.path}: {res.stop} at byte {res.end_pos} (offset {expect})",
                expect,
                max(end, expect + 1),
            )
        if res.stop == "limit":
            refill = False
        else:  # "end" or "torn": need more bytes
            refill = True
            want = max(READ_CHUNK, res.needed)
    return out, FilePosition(seg.first_offset, expect, buf_pos + cur)


def _resumes_after(fd: int, pos: int, offset: int, stop_offset: int) -> bool:
    """True if only the frame at `pos` (offset `offset`, its header intact, its payload not) is damaged: it
    is the last one that may be read, or the next frame follows right after it, intact."""
    if offset + 1 >= stop_offset:
        return True
    head = os.pread(fd, HEADER_SIZE, pos)
    nxt = pos + HEADER_SIZE + int.from_bytes(head[8:12], "little")
    head = os.pread(fd, HEADER_SIZE, nxt)
    if len(head) < HEADER_SIZE or int.from_bytes(head[:8], "little") != offset + 1:
        return False
    length = int.from_bytes(head[8:12], "little")
    if length > MAX_FRAME_PAYLOAD:
        return False
    payload = os.pread(fd, length, nxt + HEADER_SIZE)
    return len(payload) == length and payload_crc(payload) == int.from_bytes(head[12:16], "little")
