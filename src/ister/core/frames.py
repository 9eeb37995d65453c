"""WAL frame codec: pure functions, no I/O.

A frame is a 16-byte little-endian header followed by the payload:

    offset   u64   the record's offset in the topic
    length   u32   payload length in bytes (at most MAX_FRAME_PAYLOAD)
    crc      u32   CRC-32C (Castagnoli) of the payload only
    payload  `length` bytes, opaque to the WAL

Frames are written back to back with no file header, padding or trailer. `scan_frames` walks a buffer and
stops at the first frame that is incomplete ("torn"), fails its checksum ("crc"), carries an unexpected
offset ("gap") or declares an impossible length ("too_large"); everything before that point is the safe
prefix. See docs/formats.md.
"""

from __future__ import annotations

import struct
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from crc32c import crc32c

from ister.limits import MiB

HEADER = struct.Struct("<QII")
HEADER_SIZE = HEADER.size  # 16
MAX_FRAME_PAYLOAD = 64 * MiB + 1 * MiB
MAX_OFFSET = (1 << 64) - 1

StopReason = Literal["end", "torn", "crc", "gap", "too_large", "limit"]

# Sparse index defaults: one entry every this many frames or bytes, whichever comes first.
INDEX_EVERY_FRAMES = 1000
INDEX_EVERY_BYTES = 1 * MiB


# (offset, payload view, absolute byte position of the frame header = base_pos + position in the buffer)
Frame = tuple[int, memoryview, int]


@dataclass(slots=True)
class ScanResult:
    frames: list[Frame]  # valid frames in order (empty when scanning with collect=False)
    count: int  # number of valid frames (== len(frames) when collecting)
    safe_length: int  # bytes of the buffer covered by valid frames (relative to the buffer start)
    end_pos: int  # absolute position after the last valid frame: base_pos + safe_length
    stop: StopReason  # why the scan stopped at end_pos
    next_offset: int | None  # offset after the last valid frame; expect_offset (or None) if no frame
    needed: int = 0  # for "torn": bytes from end_pos needed to complete the next frame (header first)


class SparseIndex:
    """Sparse offset -> byte position index of one segment.

    Appends come from one thread (the writer or a recovery scan); lookups may come from other threads:
    entries are immutable tuples appended to a list, so a concurrent `floor` sees a consistent prefix.
    """

    __slots__ = ("_last_offset", "_last_pos", "entries", "every_bytes", "every_frames")

    def __init__(self, every_frames: int = INDEX_EVERY_FRAMES, every_bytes: int = INDEX_EVERY_BYTES) -> None:
        if every_frames < 1 or every_bytes < 1:
            raise ValueError("sparse index intervals must be positive")
        self.every_frames = every_frames
        self.every_bytes = every_bytes
        self.entries: list[tuple[int, int]] = []
        self._last_offset = -1
        self._last_pos = -1

    def add(self, offset: int, position: int) -> None:
        """Record a frame boundary unconditionally (offsets and positions must increase)."""
        if self.entries and (offset <= self._last_offset or position <= self._last_pos):
            raise ValueError("sparse index entries must increase")
        self.entries.append((offset, position))
        self._last_offset = offset
        self._last_pos = position

    def note(self, offset: int, position: int) -> None:
        """Record a frame boundary if enough frames or bytes passed since the last entry."""
        if (
            not self.entries
            or offset - self._last_offset >= self.every_frames
            or position - self._last_pos >= self.every_bytes
        ):
            self.add(offset, position)

    def floor(self, offset: int) -> tuple[int, int] | None:
        """The entry with the greatest offset <= `offset`, or None if there is none."""
        entries = self.entries
        i = bisect_right(entries, offset, hi=len(entries), key=_entry_offset) - 1
        return entries[i] if i >= 0 else None

    def __len__(self) -> int:
        return len(self.entries)


def _entry_offset(entry: tuple[int, int]) -> int:
    return entry[0]


def _check_payload(payload: bytes) -> int:
    n = len(payload)
    if n > MAX_FRAME_PAYLOAD:
        raise ValueError(f"payload of {n} bytes exceeds the frame limit of {MAX_FRAME_PAYLOAD} bytes")
    return n


def encode_frame(offset: int, payload: bytes) -> bytes:
    """One frame: header + payload."""
    if not 0 <= offset <= MAX_OFFSET:
        raise ValueError(f"offset {offset} out of range")
    n = _check_payload(payload)
    return HEADER.pack(offset, n, crc32c(payload)) + payload


def encode_frames(first_offset: int, payloads: Sequence[bytes]) -> bytes:
    """Consecutive frames with offsets first_offset, first_offset+1, ... in one buffer."""
    n = len(payloads)
    if first_offset < 0 or first_offset + n - 1 > MAX_OFFSET:
        raise ValueError(f"offsets from {first_offset} out of range")
    if n == 1:
        payload = payloads[0]
        size = _check_payload(payload)
        return HEADER.pack(first_offset, size, crc32c(payload)) + payload
    sizes = list(map(len, payloads))
    if max(sizes) > MAX_FRAME_PAYLOAD:
        _check_payload(payloads[sizes.index(max(sizes))])  # raises with the usual message
    # Headers and payloads interleaved by slice assignment: the per-record work runs in C (map), a tenth
    # less than a Python loop appending both (1,024 records of 120 bytes: 185 against 206 ns each).
    parts: list[bytes] = [b""] * (2 * n)
    parts[0::2] = map(HEADER.pack, range(first_offset, first_offset + n), sizes, map(crc32c, payloads))
    parts[1::2] = payloads
    return b"".join(parts)


def split_dense(buf: bytes, expect: int, max_frames: int) -> tuple[list[bytes], int, int, str | None]:
    """The fast path for buffers of consecutive frames (WAL segments, objects): the payloads (copies) of
    up to `max_frames` frames carrying offsets expect, expect+1, ..., each crc32c-checked.

    Returns (payloads, bytes consumed, bytes needed to complete the next frame or 0, problem) where
    problem is None, "gap" (unexpected offset), "crc" or "too_large" at the position consumed. About 4x
    cheaper per frame than `scan_frames`, which also serves recovery and indexing."""
    return split_dense_from(buf, 0, expect, max_frames)


def split_dense_from(
    buf: bytes, pos: int, expect: int, max_frames: int
) -> tuple[list[bytes], int, int, str | None]:
    """`split_dense` from byte `pos` of `buf` (a large read is not sliced first): returns (payloads, the
    position after the last frame split, bytes needed from there to complete the next frame or 0,
    problem)."""
    # Per frame this loop is most of the cost of reading a run: locals only, and `range` rather than a
    # length check (0.51 -> 0.35 us per 130-byte frame).
    unpack = HEADER.unpack_from
    n = len(buf)
    size = HEADER_SIZE
    limit = MAX_FRAME_PAYLOAD
    check = crc32c
    out: list[bytes] = []
    append = out.append
    for _ in range(max_frames):
        body = pos + size
        if body > n:
            return out, pos, (size if pos < n else 0), None
        offset, length, crc = unpack(buf, pos)
        if offset != expect:
            return out, pos, 0, "gap"
        if length > limit:
            return out, pos, 0, "too_large"
        end = body + length
        if end > n:
            return out, pos, end - pos, None
        payload = buf[body:end]
        if check(payload) != crc:
            return out, pos, 0, "crc"
        append(payload)
        expect += 1
        pos = end
    return out, pos, 0, None


def frames_size(payload_lengths: Sequence[int]) -> int:
    """Bytes taken by frames with these payload lengths."""
    return sum(payload_lengths) + HEADER_SIZE * len(payload_lengths)


def scan_frames(
    buf: bytes | bytearray | memoryview,
    base_pos: int = 0,
    expect_offset: int | None = None,
    *,
    verify_crc: bool = True,
    collect: bool = True,
    max_frames: int | None = None,
    index: SparseIndex | None = None,
) -> ScanResult:
    """Walk frames from the start of `buf` and stop at the first invalid or incomplete one.

    - `expect_offset`: the first frame must carry this offset (any offset if None); every following frame
      must carry the previous one plus one. Otherwise the scan stops with "gap".
    - `verify_crc=False` checks only headers (length limit and offset continuity).
    - `collect=False` only counts frames (no payload views are built).
    - `max_frames`: stop with "limit" after this many valid frames.
    - `index`: every valid frame boundary is offered to `index.note` (absolute positions).
    Returned payloads are memoryviews into `buf`: copy them before `buf` is reused.
    """
    mv = buf if isinstance(buf, memoryview) else memoryview(buf)
    if mv.ndim != 1 or mv.itemsize != 1:
        mv = mv.cast("B")
    n = len(mv)
    unpack = HEADER.unpack_from
    limit = MAX_FRAME_PAYLOAD
    frames: list[Frame] = []
    append = frames.append
    count = 0
    max_count = -1 if max_frames is None else max_frames
    pos = 0
    expect = expect_offset
    stop: StopReason = "end"
    needed = 0
    idx_every_frames = idx_every_bytes = 0
    idx_last_off: int | None = None
    idx_last_pos = 0
    if index is not None:
        idx_every_frames = index.every_frames
        idx_every_bytes = index.every_bytes
        if index.entries:
            idx_last_off, idx_last_pos = index.entries[-1]
    while True:
        if count == max_count:
            stop = "limit" if pos < n else "end"
            break
        if pos + HEADER_SIZE > n:
            if pos < n:
                stop = "torn"
                needed = HEADER_SIZE
            break
        offset, length, crc = unpack(mv, pos)
        if length > limit:
            stop = "too_large"
            break
        if expect is not None and offset != expect:
            stop = "gap"
            break
        start = pos + HEADER_SIZE
        end = start + length
        if end > n:
            stop = "torn"
            needed = HEADER_SIZE + length
            break
        if verify_crc and crc32c(mv[start:end]) != crc:
            stop = "crc"
            break
        if collect:
            append((offset, mv[start:end], base_pos + pos))
        if index is not None:
            abs_pos = base_pos + pos
            if (
                idx_last_off is None
                or offset - idx_last_off >= idx_every_frames
                or abs_pos - idx_last_pos >= idx_every_bytes
            ):
                index.add(offset, abs_pos)
                idx_last_off = offset
                idx_last_pos = abs_pos
        count += 1
        expect = offset + 1
        pos = end
    return ScanResult(
        frames=frames,
        count=count,
        safe_length=pos,
        end_pos=base_pos + pos,
        stop=stop,
        next_offset=expect,
        needed=needed,
    )


def decode_header(buf: bytes | bytearray | memoryview, pos: int = 0) -> tuple[int, int, int]:
    """(offset, length, crc) of the header at `pos`; raises ValueError if fewer than 16 bytes remain."""
    if len(buf) - pos < HEADER_SIZE:
        raise ValueError("incomplete frame header")
    offset, length, crc = HEADER.unpack_from(buf, pos)
    return int(offset), int(length), int(crc)


def payload_crc(payload: bytes | bytearray | memoryview) -> int:
    return int(crc32c(payload))


__all__ = [
    "HEADER",
    "HEADER_SIZE",
    "INDEX_EVERY_BYTES",
    "INDEX_EVERY_FRAMES",
    "MAX_FRAME_PAYLOAD",
    "Frame",
    "ScanResult",
    "SparseIndex",
    "StopReason",
    "decode_header",
    "encode_frame",
    "encode_frames",
    "frames_size",
    "payload_crc",
    "scan_frames",
    "split_dense",
    "split_dense_from",
]
