"""`FrameBlock`: consecutive WAL frames kept as they were read (an object's body), each frame's CRC-32C
checked once by `check_dense` when the bytes were read.

A block never copies a record: it is a buffer and the byte positions of its frames. Delivering a run of
offsets to a batch-API consumer is one slice of the buffer (the MessageBatch layout is the WAL frame layout,
docs/formats.md), so neither framing nor the checksum is done again per delivery. Pure: no I/O.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterator

from crc32c import crc32c

from ister.core.frames import HEADER, HEADER_SIZE, MAX_FRAME_PAYLOAD


def check_dense(buf: bytes, expect: int, max_frames: int) -> tuple[list[int], int, int, str | None]:
    """Check up to `max_frames` frames from the start of `buf` carrying offsets expect, expect+1, ...: their
    CRC-32C, offsets and length limit, without copying a payload (`split_dense` copies them).

    Returns (starts, bytes consumed, bytes needed to complete the next frame or 0, problem): `starts` holds
    the byte position of every checked frame and then the end of the last one (count + 1 entries); problem is
    None, "gap" (unexpected offset), "crc" or "too_large" at the position consumed."""
    unpack = HEADER.unpack_from
    mv = memoryview(buf)
    n = len(buf)
    limit = MAX_FRAME_PAYLOAD
    starts = [0]
    append = starts.append
    pos = 0
    count = 0
    while count < max_frames:
        if pos + HEADER_SIZE > n:
            return starts, pos, (HEADER_SIZE if pos < n else 0), None
        offset, length, crc = unpack(buf, pos)
        if offset != expect + count:
            return starts, pos, 0, "gap"
        if length > limit:
            return starts, pos, 0, "too_large"
        end = pos + HEADER_SIZE + length
        if end > n:
            return starts, pos, end - pos, None
        if crc32c(mv[pos + HEADER_SIZE : end]) != crc:
            return starts, pos, 0, "crc"
        pos = end
        count += 1
        append(pos)
    return starts, pos, 0, None


class FrameBlock:
    """Frames of offsets `first` .. `first + count - 1`, checked; frame i is buf[starts[i]:starts[i + 1]].

    `buf` may hold more than these frames (a block is often a slice of a larger read): `starts` says which
    bytes are this block's. Blocks are immutable; `split` and `slice` share the buffer.
    """

    __slots__ = ("buf", "count", "first", "starts")

    def __init__(self, first: int, buf: bytes, starts: list[int]) -> None:
        if len(starts) < 2:
            raise ValueError("a frame block holds at least one frame")
        self.first = first
        self.buf = buf
        self.starts = starts
        self.count = len(starts) - 1

    @property
    def end(self) -> int:
        """One past the last offset."""
        return self.first + self.count

    @property
    def nbytes(self) -> int:
        """Bytes of the frames (headers included)."""
        return self.starts[-1] - self.starts[0]

    def frames(self) -> memoryview:
        """The frames back to back, as in a WAL segment or a MessageBatch."""
        return memoryview(self.buf)[self.starts[0] : self.starts[-1]]

    def slice(self, first: int, end: int) -> FrameBlock:
        """The frames of offsets [first, end) (inside this block)."""
        i, j = first - self.first, end - self.first
        if not 0 <= i < j <= self.count:
            raise ValueError(f"offsets [{first}, {end}) are not inside [{self.first}, {self.end})")
        if i == 0 and j == self.count:
            return self
        return FrameBlock(first, self.buf, self.starts[i : j + 1])

    def prefix(self, max_records: int, max_bytes: int) -> int:
        """How many leading frames fit `max_records` and `max_bytes` of frames (at least one)."""
        n = min(self.count, max_records)
        starts = self.starts
        if starts[n] - starts[0] > max_bytes:
            n = max(1, bisect_right(starts, starts[0] + max_bytes, 0, n + 1) - 1)
        return n

    def record(self, offset: int) -> bytes:
        """The payload (the stored record) of one offset, copied."""
        i = offset - self.first
        if not 0 <= i < self.count:
            raise KeyError(offset)
        return self.buf[self.starts[i] + HEADER_SIZE : self.starts[i + 1]]

    def records(self) -> list[tuple[int, bytes]]:
        """(offset, payload) of every frame, payloads copied (the record-at-a-time readers' form)."""
        buf, starts = self.buf, self.starts
        return [(self.first + i, buf[starts[i] + HEADER_SIZE : starts[i + 1]]) for i in range(self.count)]

    def payloads(self) -> Iterator[memoryview]:
        mv = memoryview(self.buf)
        starts = self.starts
        for i in range(self.count):
            yield mv[starts[i] + HEADER_SIZE : starts[i + 1]]


__all__ = ["FrameBlock", "check_dense"]
